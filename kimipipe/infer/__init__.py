"""kp-infer's engine: admission, budget, adaptive concurrency, retries, output (see engine.py)."""
