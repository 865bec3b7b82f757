"""Where a kp-infer run's results go: response records, failure records, the routing check.

A response record is the prompt line as it came (every field passed through, undecoded)
with kp-infer's own fields, `records.Generation`, written over it; it is written whole and
flushed as the answer arrives (`durable`), so `kill -9` never loses a written answer nor
tears a line of a plain file. A prompt given up on this run goes to `--failures` as a
`records.Failure` line (its cost set when the failed answer was paid for).

Routing is verified, not trusted: `routing_violation(provider)` checks the provider that
served an answer against the policy and the endpoints table (openrouter/routing.py); an
answer that breaks it is a failure, never a result.
"""

from __future__ import annotations

import time

from ..errors import redact
from ..io import RecordWriter
from ..openrouter.attempt import Attempt
from ..openrouter.routing import Endpoint
from ..openrouter.routing import routing_violation as policy_violation
from ..records import (
    Failure,
    Generation,
    Prompt,
    ResponseText,
    Sampling,
    Usage,
    decode_passthrough,
    encode_line,
    encode_over,
)
from .config import RunConfig


def generation_fields(answer: Attempt, attempts: int, model: str,
                      sampling: Sampling | None = None) -> Generation:
    """kp-infer's fields of a response record, from an `ok` attempt (MODEL if it names none)."""
    return Generation(
        response=ResponseText(content=answer.content, reasoning=answer.reasoning),
        finish_reason=answer.finish_reason,
        model=answer.model or model,
        provider=answer.provider,
        generation_id=answer.generation_id,
        usage=Usage(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                    reasoning_tokens=answer.reasoning_tokens,
                    cost=answer.cost if answer.cost is not None else 0.0),
        attempts=attempts,
        sampling=sampling,
    )


def failure_record(prompt: Prompt, kind: str, attempt: Attempt, attempts: int, *,
                   provider: str | None = None, cost: float = 0.0,
                   generation_id: str | None = None) -> Failure:
    return Failure(
        id=prompt.id, dataset=prompt.dataset, kind=kind, status=attempt.status,
        code=attempt.code or attempt.cause, message=redact(attempt.message), attempts=attempts,
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        provider=provider or None, generation_id=generation_id or None, cost=cost,
    )


class Output:
    """The output file and the failures file of one run (`open()`, then `close()`)."""

    def __init__(self, config: RunConfig, endpoints: list[Endpoint] | None):
        self.config = config
        self.endpoints = endpoints
        self.sampling = config.request.sampling(config.policy)  # the same for every prompt
        self.responses: RecordWriter | None = None
        self.failures: RecordWriter | None = None

    def open(self) -> None:
        self.responses = RecordWriter(self.config.output, append=True, durable=True)
        if self.config.failures:
            self.failures = RecordWriter(self.config.failures, append=True, durable=True)

    def close(self) -> None:
        if self.responses is not None:
            try:
                self.responses.close()
            except OSError:
                pass  # a closed pipe or a full disk: already reported as an output stop
        if self.failures is not None:
            self.failures.close()

    def routing_violation(self, provider: str | None) -> str | None:
        """Why an answer served by PROVIDER breaks the routing policy, or None."""
        return policy_violation(self.config.policy, provider, self.endpoints)

    def write_response(self, prompt_line: bytes, answer: Attempt, attempts: int) -> None:
        """The response record of PROMPT_LINE (raises OSError when the output is gone)."""
        fields = generation_fields(answer, attempts, self.config.request.model, self.sampling)
        self.responses.write_line(encode_over(decode_passthrough(prompt_line), fields))

    def write_failure(self, failure: Failure) -> None:
        if self.failures is not None:
            self.failures.write_line(encode_line(failure))
