"""One completion sent to see everything about it: the answer, and the shape of the wire.

`kp-infer --preflight` (infer/preflight.py) checks the assumptions a long run rests on
before the money goes. The data plane (openrouter/client.py over http11) reads streams
for the least CPU per chunk and hands the assembler only `data:` payloads, which hides
what a preflight must see: the keep-alive comments (`: OPENROUTER PROCESSING`), whether
where the usage came (a last chunk of its own with `choices: []`, or on the finish chunk:
OpenRouter sends both shapes), whether `[DONE]` ended the stream,
and where the reasoning came from. So a probe goes over httpx (the control plane's
library, account.py), line by line, and assembles the answer with the very code the run
uses (`StreamAnswer` for a stream, `answer.read_plain` for a plain body), so
the answer it gives is the one a run would have kept.

    async with httpx.AsyncClient(...) as http:
        probe = await send_probe(http, base_url, api_key, body, stream=True)
        probe.attempt            # an Attempt, as the run would have it
        probe.comments, probe.usage_shape, probe.finished, probe.done, probe.reasoning_fields
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import msgspec

from ..errors import redact
from ..kinds import AttemptKind, RetryCause
from .answer import StreamAnswer, read_plain
from .attempt import Attempt, error_attempt, retry_after_seconds
from .client import COMPLETION_HEADERS

# The two shapes of a stream's last chunk, both OpenRouter's (docs/robustness.md, docs/kp-infer.md).
USAGE_OWN_CHUNK = "own chunk"  # a chunk of its own with `choices: []`
USAGE_ON_FINISH = "finish chunk"  # on the chunk whose choice carries finish_reason


@dataclass
class Probe:
    attempt: Attempt
    status: int = 0
    streamed: bool = False
    comments: int = 0  # keep-alive comment lines (`: ...`)
    events: int = 0  # `data:` lines
    usage_shape: str | None = None  # where the usage came: USAGE_OWN_CHUNK, USAGE_ON_FINISH
    finished: bool = False  # a choice carried a finish_reason
    done: bool = False  # the stream ended with `data: [DONE]`
    reasoning_fields: set[str] = field(default_factory=set)  # reasoning, reasoning_details
    seconds: float = 0.0


def _note_chunk(probe: Probe, payload: bytes) -> None:
    """What one chunk says about the stream's shape (besides what StreamAnswer keeps)."""
    try:
        chunk = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return
    if not isinstance(chunk, dict):
        return
    choices = [c for c in chunk.get("choices") or () if isinstance(c, dict)]
    finish = any(c.get("finish_reason") is not None for c in choices)
    probe.finished = probe.finished or finish
    if chunk.get("usage") is not None:
        probe.usage_shape = USAGE_OWN_CHUNK if not choices else USAGE_ON_FINISH if finish else "a content chunk"
    for choice in choices:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            probe.reasoning_fields.update(k for k in ("reasoning", "reasoning_details") if delta.get(k))


async def send_probe(http: httpx.AsyncClient, base_url: str, api_key: str, body: bytes,
                     stream: bool) -> Probe:
    """Send BODY to /chat/completions and read every line of the answer."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
               **COMPLETION_HEADERS}
    started = time.monotonic()
    probe = Probe(Attempt(AttemptKind.RETRY, cause=RetryCause.CONNECTION), streamed=stream)
    try:
        async with http.stream("POST", url, content=body, headers=headers) as response:
            probe.status = response.status_code
            if response.status_code != 200 or not stream:
                raw = await response.aread()
                probe.attempt = _plain(response, raw)
            else:
                probe.attempt = await _read_stream(response, probe)
    except httpx.HTTPError as e:
        probe.attempt = Attempt(AttemptKind.RETRY, cause=RetryCause.CONNECTION,
                                message=redact(f"{type(e).__name__}: {e}")[:300])
    probe.seconds = time.monotonic() - started
    return probe


def _plain(response: httpx.Response, raw: bytes) -> Attempt:
    if response.status_code == 200:
        return read_plain(raw)
    try:
        payload = msgspec.json.decode(raw) if raw.strip() else None
    except msgspec.DecodeError:
        payload = None
    return error_attempt(response.status_code, payload,
                         retry_after_seconds(response.headers.get("retry-after")),
                         f"HTTP {response.status_code}")


async def _read_stream(response: httpx.Response, probe: Probe) -> Attempt:
    answer = StreamAnswer()
    decided: Attempt | None = None
    async for line in response.aiter_lines():
        if not line.strip():
            continue
        if line.startswith(":"):
            probe.comments += 1
            continue
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip().encode()
        probe.events += 1
        if payload == b"[DONE]":
            probe.done = True
        else:
            _note_chunk(probe, payload)
        if decided is None:
            decided = answer.event(payload)
    return decided if decided is not None else answer.end()
