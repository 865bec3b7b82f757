"""Each `--server` asked what it serves, before anything is sent (`discover_servers`).

`GET URL/models` (vLLM's and SGLang's `/v1/models`), through the client the run will
send that server its prompts with (openrouter/client.py, as `Sources.for_run` makes it:
its proxy rules and its connections' checks), gives the `Server` (infer/servers.py): the
model name to send (the `#NAME` of `--server URL#NAME` when given, else the run's
`--model` when served, else the one model it serves), its kind (`owned_by`: vllm,
sglang) and its context (`max_model_len`). A server that cannot say, or serves no such
model, or whose context cannot hold `--max-tokens`, is exit 2 with one line. Not for
`--plan`, which sends nothing anywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from ..errors import ExitCode, KPError, redact
from ..openrouter.client import CompletionClient
from .config import RunConfig
from .servers import Server, ServerKind, server_api_key, split_server

DISCOVERY_TIMEOUT = 30.0  # seconds for a server's GET /v1/models at the start
_json = msgspec.json


def discover(arg: str, model: str, timeout: float = DISCOVERY_TIMEOUT) -> Server:
    """Ask the server of ARG (`URL[#MODEL]`) what it serves (GET /v1/models): the Server,
    with the model name to send (MODEL; else MODEL, the run's --model, when served; else
    the one model it serves). Exit 2 when it cannot say, or serves no such model."""
    url, named = split_server(arg)
    where = f"--server {arg}"
    try:
        status, body = asyncio.run(_models(url, timeout))
        if status != 200:
            raise ValueError(f"HTTP {status}")
        entries = [e for e in _json.decode(body).get("data") or () if isinstance(e, dict)
                   and isinstance(e.get("id"), str)]
    except (OSError, TimeoutError, ValueError, AttributeError, msgspec.DecodeError) as e:
        raise KPError(f"{where}: GET {url.rstrip('/')}/models (what it serves) failed: "
                      f"{redact(str(e) or type(e).__name__)[:300]}; is the server up?",
                      ExitCode.USAGE) from None
    served = {e["id"]: e for e in entries}
    if named is not None:
        chosen = named
    elif model in served:
        chosen = model
    elif len(served) == 1:
        chosen = next(iter(served))
    else:
        chosen = None
    if chosen not in served:
        listed = ", ".join(served) or "no model"
        wanted = f"#{named}" if named else f"--model {model}"
        raise KPError(f"{where}: it serves {listed}, not {wanted}; name the one to use "
                      "as --server URL#NAME", ExitCode.USAGE)
    owner = str(served[chosen].get("owned_by") or "").lower()
    kind = ServerKind(owner) if owner in {k.value for k in ServerKind} else ServerKind.OTHER
    context = served[chosen].get("max_model_len")  # vLLM and SGLang report it
    context = context if isinstance(context, int) and not isinstance(context, bool) \
        and context > 0 else None
    return Server(url, chosen, kind, context)


async def _models(url: str, timeout: float) -> tuple[int, bytes]:
    """GET URL/models through the client the run will send the server its prompts with
    (`Sources.for_run`: its proxy rules, its connections' checks)."""
    async with CompletionClient(url, server_api_key(), idle_timeout=timeout,
                                connect_timeout=timeout) as client:
        return await client.get("/models")


def check_context(servers: list[Server], max_tokens: int | None) -> None:
    """Exit 2, before anything is sent, when --max-tokens is more than a server's context:
    vLLM refuses every such request (400, `max_tokens ... cannot be greater than
    max_model_len`), so the run would fail every prompt. Not clamped: the answers' length
    cap is part of the dataset's recipe, which the user chooses."""
    for server in servers:
        if max_tokens is not None and server.max_model_len is not None \
                and max_tokens > server.max_model_len:
            raise KPError(f"--max-tokens {max_tokens:,} is more than {server.name} can "
                          f"generate: its context (max_model_len) is {server.max_model_len:,} "
                          "tokens, prompt included; pass --max-tokens below "
                          f"{server.max_model_len:,}", ExitCode.USAGE)


def discover_servers(config: RunConfig, say: Callable[[str], None]) -> list[Server]:
    """Each --server asked what it serves (`discover`; exit 2 when one
    cannot say); not for --plan, which sends nothing anywhere."""
    if config.plan:
        return []
    servers = [discover(arg, config.request.model) for arg in config.sending.servers]
    check_context(servers, config.request.max_tokens)
    for server in servers:
        if server.model != config.request.model:
            say(f"kp-infer: {server.name} serves {config.request.model} as {server.model!r} "
                f"({server.kind}); its records name {config.request.model}")
    return servers
