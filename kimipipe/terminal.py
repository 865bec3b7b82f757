"""What a command writes on stderr, and how: progress bars, messages, counts.

Nothing but records goes to stdout; progress (`progress`, tqdm: redrawn on a terminal, a
plain line every 10 s otherwise), warnings and summaries (`say`, or a command's `Stderr`,
which writes its messages between the redraws of its bar) go to stderr, redacted, and
`--quiet` silences them all. Summary lines count things with `counted(n, "record")` (`1
record`, `12,345 records`) and dollars with `money`, so numbers and plurals read the same in
every command.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from .errors import redact

if TYPE_CHECKING:
    from tqdm import tqdm


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`1 record`, `2 records`, `12,345 records`: how every summary line counts."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


PROGRESS_INTERVAL_ENV = "KP_PROGRESS_INTERVAL"
# Without the bar graphics: at 80 columns tqdm's bar squeezes to one character and the
# counts after it are cut off.
NARROW_FORMAT = "{desc}: {n_fmt}/{total_fmt} {percentage:.0f}% [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def money(x: float) -> str:
    """A dollar figure as the reports and make's messages write it: `$12.34` from a
    dollar, `$0.0123` below."""
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


def progress_interval() -> float:
    """Seconds between plain progress lines when stderr is not a terminal: 10, or
    KP_PROGRESS_INTERVAL (tests shorten it)."""
    try:
        return max(0.05, float(os.environ.get(PROGRESS_INTERVAL_ENV) or 10))
    except ValueError:
        return 10.0


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def stderr_width() -> int:
    """The terminal's columns on stderr (80 when it cannot be told)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


class PlainLines:
    """A file for tqdm when stderr is not a terminal (make, a log): each frame a line of
    its own, no carriage returns and no padding."""

    def __init__(self, stream):
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress(total: int | None = None, desc: str = "", unit: str = "rec", quiet: bool = False,
             **kwargs) -> tqdm:
    """A progress bar on stderr (never stdout), silenced by --quiet.

    On a terminal: tqdm's frames, redrawn in place, without the bar graphics when the
    terminal is under 100 columns. Otherwise plain lines, one every KP_PROGRESS_INTERVAL
    seconds (default 10; see `progress_interval`)."""
    from tqdm import tqdm  # here, not at the top: ~30 ms of start-up (tqdm.version)

    if stderr_is_terminal():
        options = {"file": sys.stderr, "dynamic_ncols": True, "mininterval": 0.5}
        if total and stderr_width() < 100:
            options["bar_format"] = NARROW_FORMAT
    else:
        options = {"file": PlainLines(sys.stderr), "mininterval": progress_interval()}
        if total:
            options["bar_format"] = NARROW_FORMAT
    options.update(kwargs)
    return tqdm(total=total, desc=desc, unit=unit, disable=quiet, **options)


class Stderr:
    """A command's messages (warnings, notes, the summary) on stderr: redacted, written
    between redraws of its progress bar, and silenced, all of them, by --quiet.

        say = Stderr(quiet)
        say("kp-x: warning: ...")
        with say.progress(total=n, desc="kp-x", unit="req") as bar: ...
    """

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self._bar: tqdm | None = None

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        message = redact(message)
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            click.echo(message, err=True)

    @contextmanager
    def progress(self, total: int | None = None, desc: str = "", unit: str = "rec",
                 **kwargs) -> Iterator[tqdm]:
        """A progress bar (see `progress`) that messages are written around while it is open."""
        bar = progress(total=total, desc=desc, unit=unit, quiet=self.quiet, **kwargs)
        self._bar = bar
        try:
            yield bar
        finally:
            self._bar = None
            bar.close()


def say(message: str, quiet: bool = False) -> None:
    """One warning or summary line on stderr (see `Stderr`)."""
    Stderr(quiet)(message)
