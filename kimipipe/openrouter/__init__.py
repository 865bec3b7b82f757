"""OpenRouter as a library: money (balance and credits), and, as they land, the client
(HTTP, SSE, retries, errors) and routing (provider policy and its verification)."""

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
