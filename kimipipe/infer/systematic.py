"""A systematic failure: every request refused the same way is a configuration error.

A parameter the model does not take (a 400 "invalid temperature"), a field OpenRouter
rejects, a provider object it does not know: every request of the run gets the same
permanent failure, and a run of 100,000 prompts would write 100,000 failure lines (each
one sent, each one a prompt to redo). `SystematicFailure` watches the permanent failures
(the prompt's own fault: kinds.FailureKind.PERMANENT) and says when STOP_AFTER of them in a
row are identical (same status and message) with no answer in between: the run then stops,
exit 2, naming the status and the message and suggesting `--preflight`. What was answered
is kept; the failures written are retried by the next run, as any failure is.

It is fed from one place, the prompt's work writing a failure (infer/prompt_work.py), with
the run's count of answers, so an answer between two failures restarts the count.
"""

from __future__ import annotations

from ..openrouter.attempt import Attempt

STOP_AFTER = 50


class SystematicFailure:
    def __init__(self, stop_after: int = STOP_AFTER):
        self.stop_after = stop_after
        self.signature: tuple[int, str] | None = None
        self.streak = 0
        self._answers_seen = 0

    def permanent_failure(self, attempt: Attempt, answers: int) -> str | None:
        """Count one permanent failure (ANSWERS: the run's answers so far); the stop's
        message once STOP_AFTER identical ones came in a row, else None."""
        signature = (attempt.status, attempt.message)
        if answers != self._answers_seen or signature != self.signature:
            self._answers_seen, self.signature, self.streak = answers, signature, 0
        self.streak += 1
        if self.streak != self.stop_after:
            return None
        status = f"HTTP {attempt.status}" if attempt.status else "an error"
        return (f"{self.streak} requests in a row failed the same way, with no answer in "
                f"between: {status}: {attempt.message}; that is the run's configuration, not "
                "the prompts (a parameter or a provider setting the model does not take): "
                "check it with --preflight, then rerun the same command to resume")
