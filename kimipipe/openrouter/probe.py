"""One completion sent as the run sends it, with a tap that records the shape of the wire.

`kp-infer --preflight` (infer/preflight.py) checks the assumptions a long run rests on
before the money goes. Its requests go through the run's own client (openrouter/client.py
over http11.py, as infer/transport.py opens it), so what it sees is what the run will see:
the same connections, proxy, headers, timeouts and answer assembly. The client hands the
assembler only the `data:` payloads, which hides what a preflight must see: the keep-alive
comments (`: OPENROUTER PROCESSING`), where the usage came (a last chunk of its own with
`choices: []`, or on the finish chunk: OpenRouter sends both shapes), whether `[DONE]`
ended the stream, and which reasoning fields were on the wire. So a preflight's stream is
assembled by a `ProbeAnswer`: the run's `StreamAnswer` (the answer it gives is the one a
run would have kept) with a tap on every payload and, through http11's `lines` hook, on
every line of the stream.

    probe = await send_probe(client.attempt, body, stream=True)
    probe.attempt            # an Attempt, as the run would have it
    probe.comments, probe.usage_shape, probe.finished, probe.done, probe.reasoning_fields
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from ..kinds import AttemptKind
from .answer import StreamAnswer
from .attempt import Attempt

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


class ProbeAnswer(StreamAnswer):
    """The run's StreamAnswer, with a tap: every line and `data:` payload of the stream
    noted on PROBE before the answer takes it."""

    __slots__ = ("probe",)

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def lines(self, lines: list[bytes]) -> None:
        """Every whole line of one read (http11.py): the keep-alive comments counted."""
        self.probe.comments += sum(1 for line in lines if line[:1] == b":")

    def events(self, payloads: list[bytes]) -> Attempt | None:
        probe = self.probe
        for payload in payloads:
            probe.events += 1
            if payload == b"[DONE]":
                probe.done = True
            else:
                _note_chunk(probe, payload)
        return super().events(payloads)


Send = Callable[[bytes, bool, StreamAnswer | None], Awaitable[Attempt]]


async def send_probe(send: Send, body: bytes, stream: bool) -> Probe:
    """BODY sent by SEND (the run's: `CompletionClient.attempt`, or `Sources.send` to one
    source), a stream read through a ProbeAnswer."""
    probe = Probe(Attempt(AttemptKind.RETRY), streamed=stream)
    started = time.monotonic()
    probe.attempt = await send(body, stream, ProbeAnswer(probe) if stream else None)
    probe.seconds = time.monotonic() - started
    probe.status = probe.attempt.status
    return probe
