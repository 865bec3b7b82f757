"""OpenRouter as a library: what kimipipe sends, reads and checks (facts: docs/openrouter.md).

    request.py       the chat completion request body (`RequestOptions.body`)
    client.py        the data plane: one completion attempt over HTTP (`CompletionClient`),
                     streamed or plain
    answer.py        the answer assembled from what came (`StreamAnswer`, `read_plain`):
                     reasoning, token logprobs, the Attempt
    wire.py          the msgspec views of a body and a streamed chunk, and their decoders
    http11.py        the HTTP/1.1 connection pool under the client: llhttp framing, SSE
                     split in the body callback (http11_message.py: the request head)
    connect.py       connecting: every resolved address, proxies' CONNECT tunnels, TLS
    proxy.py         HTTPS_PROXY/NO_PROXY and --proxy; scrubbing proxy passwords
    outcomes.py      what the pool hands back: a collected response, a stall, a break
    attempt.py       an attempt's outcome (`Attempt`) and the classification of error answers
    account.py       the control plane: the endpoints table, the model's entry
                     (distillation), the balance (httpx, for kp-infer and kp-credits alike)
    probe.py         --preflight's tap on the run's client: the answer as the run assembles
                     it, and the stream's shape (comments, usage, [DONE])
    routing.py       the provider policy, the `provider` object, and checking who served
    models.py        per-model presets (Kimi K2.5's native INT4 weights: the routing default;
                     its sampling as served)
    api_key.py       the API key, from --api-key-file or OPENROUTER_API_KEY, kept secret
"""

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
