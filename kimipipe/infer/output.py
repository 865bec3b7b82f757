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
answer that breaks it is a failure, never a result. An answer from a provider name that
covers an excluded variant as well as an allowed endpoint cannot be traced (no response
field names the endpoint): it is kept, marked `"routing": "unverifiable"`.
Routing and reasoning are verified, not trusted (`Output.refusal(answer)`): an answer is
not a result when
    routing_violation  the provider that served it is one the policy and the endpoints
                       table exclude (openrouter/routing.py);
    think_marker       reasoning was asked for and a think tag is left where a leaked
                       reasoning block puts one: the content begins with `<think>` or
                       `</think>`, or holds a `</think>` while no reasoning came back (the
                       provider's template opened the block and never parsed it), or holds
                       either tag after an inline block was split off (where the split fell
                       is then uncertain);
    no_reasoning       reasoning was asked for and none came back (empty or blank).
A tag elsewhere in the content of an answer whose reasoning came in its own field is text
the model wrote (the stand-in writes such traps on purpose) and is kept: refusing it would
pay for the same answer again at every provider. An answer cut by `max_tokens`
(`finish_reason: length`) whose reasoning ran into the limit has its reasoning and is kept,
marked by its finish reason.

A refused answer was paid for: the run (infer/prompt_work.py) counts its cost, and sends the prompt
again with the provider that served it added to that prompt's `provider.ignore`
(`next_policy`; not when that would leave the endpoints table no allowed provider: then the
same routing again), up to `--max-attempts`; the refusals ride on the record finally
written (`refused`, cost included) or on its failure line.
"""

from __future__ import annotations

import errno
import time

from ..errors import KPError, redact
from ..io import OutputWriteError, RecordWriter
from ..openrouter.attempt import Attempt
from ..openrouter.routing import Endpoint, Policy, allowed_endpoints, slugs_of
from ..openrouter.routing import routing_violation as policy_violation
from ..records import (
    Failure,
    Generation,
    Prompt,
    Refusal,
    ResponseText,
    Sampling,
    Usage,
    decode_passthrough,
    encode_line,
    encode_over,
)
from .config import RunConfig
from .rescue import Rescue

WRITTEN, RESCUED, LOST = "written", "rescued", "lost"

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def reasoning_refusal(answer: Attempt) -> tuple[str, str] | None:
    """(think_marker | no_reasoning, why) for an answer to a request that asked for
    reasoning, or None when its reasoning is what a record needs (module docstring)."""
    content = answer.content
    head = content.lstrip()
    has_reasoning = bool((answer.reasoning or "").strip())
    for tag in (THINK_OPEN, THINK_CLOSE):
        if head.startswith(tag):
            return "think_marker", f"the content begins with {tag}"
    if answer.reasoning_source == "inline" and (THINK_OPEN in content or THINK_CLOSE in content):
        return "think_marker", "a think tag is left in the content after the inline reasoning"
    if not has_reasoning and THINK_CLOSE in content:
        return "think_marker", "no reasoning, and a </think> in the content"
    if not has_reasoning:
        return "no_reasoning", "reasoning was asked for and none came back"
    return None


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
                   generation_id: str | None = None,
                   refused: list[Refusal] | None = None) -> Failure:
    """A failure line; COST is what was paid for this prompt this run (its REFUSED answers)."""
    return Failure(
        id=prompt.id, dataset=prompt.dataset, kind=kind, status=attempt.status,
        code=attempt.code or attempt.cause, message=redact(attempt.message), attempts=attempts,
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        provider=provider or None, generation_id=generation_id or None, cost=cost,
        refused=list(refused or ()), error_type=attempt.error_type or None,
    )


class Output:
    """The output file and the failures file of one run (`open()`, then `close()`)."""

    def __init__(self, config: RunConfig, endpoints: list[Endpoint] | None):
        self.config = config
        self.endpoints = endpoints
        self.sampling = config.request.sampling(config.policy)  # the same for every prompt
        self.expects_reasoning = config.request.asks_for_reasoning()
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

    def refusal(self, answer: Attempt) -> tuple[str, str] | None:
        """(kind, why) when an `ok` ANSWER is not a result (module docstring), else None."""
        violation = self.routing_violation(answer.provider)
        if violation:
            return "routing_violation", violation
        if self.expects_reasoning:
            return reasoning_refusal(answer)
        return None

    def next_policy(self, policy: Policy, provider: str | None) -> Policy:
        """POLICY with PROVIDER (an answer of it refused) added to `ignore`, for that prompt's
        next attempt; POLICY itself when the endpoints table would have no provider left."""
        if not provider:
            return policy
        widened = policy.ignoring(slugs_of(provider, self.endpoints))
        if self.endpoints is not None and not allowed_endpoints(widened, self.endpoints):
            return policy
        return widened

    def write_response(self, prompt_line: bytes, answer: Attempt, attempts: int, *,
                       refused: list[Refusal] | None = None, latency: float | None = None) -> str:
        """Write the response record of PROMPT_LINE: WRITTEN, RESCUED or LOST."""
        fields = generation_fields(answer, attempts, self.config.request.model, self.sampling)
        fields.refused = list(refused or ())
        fields.latency_s = round(latency, 3) if latency is not None else None
        if answer.provider in self.config.policy.unverifiable_names:
            fields.routing = "unverifiable"  # (counted in the summary: report.py)
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
