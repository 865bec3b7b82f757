"""Where a kp-infer run's results go: response records, failure records, the routing check.

A response record is the prompt line as it came (every field passed through, undecoded)
with kp-infer's own fields, `records.Generation`, written over it; it is written whole and
flushed as the answer arrives (`durable`), so `kill -9` never loses a written answer nor
tears a line of a plain file. A prompt given up on this run goes to `--failures` as a
`records.Failure` line (its cost set when the failed answer was paid for).

A write the output refuses (a full disk, a file size limit, an I/O error; RecordWriter has
cut the file back to its last whole record) stops the run; that answer and every one still
arriving are paid for, so they go to the rescue file (infer/rescue.py), which the next run
takes in first. Each write says what became of its record: WRITTEN, RESCUED or LOST (stdout
closed, or the rescue file failed too).

Routing is verified, not trusted: `routing_violation(provider)` checks the provider that
served an answer against the policy and the endpoints table (openrouter/routing.py); an
answer that breaks it is a failure, never a result.
"""

from __future__ import annotations

import errno
import time

from ..errors import KPError, redact
from ..io import OutputWriteError, RecordWriter
from ..openrouter.attempt import Attempt
from ..openrouter.routing import Endpoint
from ..openrouter.routing import routing_violation as policy_violation
from ..records import (
    Failure,
    Generation,
    Prompt,
    ResponseText,
    Usage,
    decode_passthrough,
    encode_line,
    encode_over,
)
from .config import RunConfig
from .rescue import Rescue

WRITTEN, RESCUED, LOST = "written", "rescued", "lost"


def generation_fields(answer: Attempt, attempts: int, model: str) -> Generation:
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
        self.responses: RecordWriter | None = None
        self.failures: RecordWriter | None = None
        self.rescues = {name: Rescue(path, config.rescue_dir)
                        for name, path in (("output", config.output), ("failures", config.failures))
                        if path and path != "-"}
        self.error: OSError | None = None  # the first write either file refused
        self.error_file: str | None = None

    def open(self) -> None:
        self.responses = RecordWriter(self.config.output, append=True, durable=True)
        if self.config.failures:
            self.failures = RecordWriter(self.config.failures, append=True, durable=True)

    def close(self) -> None:
        for writer in (self.responses, self.failures):
            if writer is not None:
                try:  # (a .zst file's frame is ended here; if even that fails, the next run does)
                    writer.close()
                except (OSError, KPError):
                    pass  # a closed pipe or a full disk: already reported as an output stop
        self.responses = self.failures = None
        for rescue in self.rescues.values():
            rescue.close()

    def routing_violation(self, provider: str | None) -> str | None:
        """Why an answer served by PROVIDER breaks the routing policy, or None."""
        return policy_violation(self.config.policy, provider, self.endpoints)

    def write_response(self, prompt_line: bytes, answer: Attempt, attempts: int) -> str:
        """Write the response record of PROMPT_LINE: WRITTEN, RESCUED or LOST."""
        fields = generation_fields(answer, attempts, self.config.request.model)
        return self._write("responses", "output", encode_over(decode_passthrough(prompt_line), fields))

    def write_failure(self, failure: Failure) -> str:
        if not self.config.failures:
            return WRITTEN  # (not asked to keep them)
        return self._write("failures", "failures", encode_line(failure))

    def _write(self, attribute: str, name: str, line: bytes) -> str:
        writer: RecordWriter | None = getattr(self, attribute)
        if writer is not None:
            try:
                writer.write_line(line)
                return WRITTEN
            except (OSError, OutputWriteError) as e:
                # (the writer has closed itself; a closed stdout is closed for good too)
                setattr(self, attribute, None)
                if self.error is None:
                    self.error = e.error if isinstance(e, OutputWriteError) else e
                    self.error_file = writer.path
        rescue = self.rescues.get(name)
        if rescue is not None and rescue.save(line):
            return RESCUED
        return LOST

    @property
    def disk_full(self) -> bool:
        """The write that failed was refused for room (a full disk, a quota, a size limit)."""
        return self.error is not None and self.error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
