"""What every kp-* command shares: how it is declared, its help and exit codes, how it runs.

A command module declares its settings type, a Struct whose fields are its options
(kimipipe/options.py, with the shared ones: INPUT, OUTPUT, QUIET, DEBUG, PARTITION),
and its click command with `@kp_command(NAME, settings=TYPE, examples=...)`, which gives
it `-h`/`--help`, `--version` and a help ending with an Examples block and the exit codes;
the function takes one instance of TYPE. A command with words (`kp-shard verify DIR`) is a
`KPGroup` of its default command and the words. The module exposes `main =
run_command(cli)`; the console_scripts in setup.cfg point at `main`. `run_command` turns
expected failures (KPError) into one line on stderr and their exit code, a closed stdout
pipe (`kp-prompts x | head -1`) into a quiet exit, Ctrl-C into exit 130, and anything else
into one line and exit 1; `--debug` or `KP_DEBUG=1` shows the traceback instead. What a
command writes on stderr (progress, messages, counts): kimipipe/terminal.py.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from . import __version__
from .errors import ExitCode, KPError, redact
from .options import (
    CommandSettings,
    check_settings,
    parameters,
    sections_of,
    settings_from,
)

if TYPE_CHECKING:
    pass

EXIT_CODES_HELP = (
    "Exit codes: 0 success (for kp-infer also: --token-budget reached); 1 unexpected error; "
    "2 usage or input error (nothing done); 3 stopped by money (a cost cap, the balance or a "
    "credit limit) or a full disk: nothing paid for is lost, rerun to resume; 4 finished with "
    "permanent failures; 130 interrupted (rerun to resume)."
)
# Each command's own exit codes, the footer of its --help (kp_command looks its name up; a
# command not listed here passes `exit_codes=` itself, as kp-credits does).
EXIT_CODES = {
    "kp-infer": EXIT_CODES_HELP,
    "kp-prompts": "Exit codes: 0 success; 1 unexpected error; 2 usage or input error (nothing "
                  "written); 3 no room for the output (a full disk or a file size limit); "
                  "130 interrupted.",
    "kp-tokenize": "Exit codes: 0 success; 1 unexpected error; 2 usage or input error (nothing "
                   "done); 3 no room for the output (a full disk or a file size limit): rerun "
                   "to resume; 4 finished, some records failed verification (kept out, listed "
                   "in --rejects); 130 interrupted (rerun to resume).",
    "kp-shard": "Exit codes: 0 success; 1 unexpected error; 2 usage or input error (nothing "
                "written), or verify found problems; 3 no room for the output (a full disk or "
                "a file size limit); 130 interrupted.",
    "kp-shard verify": "Exit codes: 0 every set verified; 1 unexpected error; 2 a set has "
                       "problems (named on stderr), or no set found.",
    "kp-shard stats": "Exit codes: 0 success; 1 unexpected error; 2 no set found, or a set "
                      "that cannot be read.",
    "kp-infer report": "Exit codes: 0 success; 1 unexpected error; 2 a file missing or not "
                       "responses or failures records.",
}


class ClosedOutputPipe(Exception):
    """stdout's reader went away (`kp-... | head -1`): a quiet exit 0, not an error."""


class KPContext(click.Context):
    """A kp-* command's context. A group's default command, run without a word (`kp-shard
    IN --out DIR`), reads as the group itself: `Usage: kp-shard [OPTIONS] [INPUTS]...`,
    `Try 'kp-shard -h' for help.`"""

    @property
    def command_path(self) -> str:
        if self.parent is not None and not self.info_name:
            return self.parent.command_path
        return super().command_path


class KPCommand(click.Command):
    """A kp-* command: `-h` and `--help`, `--version` (not on a word: its parent's), and a
    help that ends with an Examples block (lines kept as written) and the exit codes.
    SECTIONS: the --help headings its options come under (SECTION_OF: parameter name ->
    heading; --version and -h close the last), else one list.

    A closed stdout pipe leaves the command as ClosedOutputPipe, which run_command turns
    into a quiet exit 0 (click itself would make an EPIPE exit 1, silently).
    """

    context_class = KPContext

    def __init__(self, *args, examples: str = "", exit_codes: str | None = None,
                 sections: list[str] | None = None, section_of: dict[str, str] | None = None,
                 word: bool = False, **kwargs):
        self.sections, self.section_of = sections, section_of or {}
        settings = kwargs.setdefault("context_settings", {})
        settings.setdefault("help_option_names", ["-h", "--help"])
        super().__init__(*args, **kwargs)
        self.examples = textwrap.dedent(examples).strip("\n")
        self.exit_codes = exit_codes if exit_codes is not None else EXIT_CODES.get(self.name or "", "")
        if not word:  # last of the options, just before -h/--help
            click.version_option(__version__, "--version", prog_name=self.name,
                                 message="%(prog)s %(version)s",
                                 help="Show the version and exit.")(self)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise ClosedOutputPipe() from None

    def format_options(self, ctx, formatter) -> None:
        """With SECTIONS: the options under their headings, in field order within each."""
        if self.sections is None:
            return super().format_options(ctx, formatter)
        sections: dict[str, list] = {title: [] for title in self.sections}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                sections[self.section_of.get(param.name or "", self.sections[-1])].append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def format_epilog(self, ctx, formatter) -> None:
        super().format_epilog(ctx, formatter)
        if self.examples:
            formatter.write_paragraph()
            formatter.write_text("Examples:")
            indent = " " * (formatter.current_indent + 2)
            for line in self.examples.splitlines():  # not rewrapped: commands are copied
                formatter.write(f"{indent}{line}\n" if line.strip() else "\n")
        if self.exit_codes:
            formatter.write_paragraph()
            formatter.write_text(self.exit_codes)


# What a group's parser is given in place of a word: its default command (no word is "").
_DEFAULT = ""


class KPGroup(click.Group):
    """A kp-* command with words (`kp-shard verify DIR...`, `kp-infer report FILE...`), each
    a command of its own, and a default command (the build, the run) for everything else.

    The first argument is a word when the word's own arguments follow it (the next one is
    not an option) or its help is asked for (`kp-shard stats -h`). Otherwise every argument
    is the default command's, whose help, usage and errors are the group's own
    (`kp-shard -h`), and a file named like a word is still an input
    (`kp-infer report --plan` reads the file `report`)."""

    def __init__(self, default: KPCommand, words: Iterable[KPCommand]):
        super().__init__(default.name, commands={(w.name or "").split()[-1]: w for w in words},
                         add_help_option=False, no_args_is_help=False)
        self.default = default

    def is_word(self, args: list[str]) -> bool:
        if not args or args[0] not in self.commands:
            return False
        rest = args[1:]
        return (bool(rest) and not rest[0].startswith("-")) or any(a in ("-h", "--help") for a in rest)

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, list(args) if self.is_word(args) else [_DEFAULT, *args])

    def get_command(self, ctx, cmd_name):
        return self.default if cmd_name == _DEFAULT else super().get_command(ctx, cmd_name)


S = TypeVar("S", bound=CommandSettings)


def kp_command(name: str, *, settings: type[S], examples: str, exit_codes: str | None = None,
               sections: list[str] | None = None, cls: type[KPCommand] = KPCommand,
               **attrs) -> Callable[[Callable[[S], Any]], KPCommand]:
    """`@click.command` for a kp-* command (see KPCommand) whose options are the fields of
    SETTINGS (kimipipe/options.py), checked here, at import: the decorated function takes
    one SETTINGS instance. A name of several words has no --version: a word of a group,
    named with its parent (`kp-infer report`: the parent's flag), or a module run with
    `python -m` (the stand-in, the demo)."""
    check_settings(name, settings, sections)

    def decorator(f: Callable[[S], Any]) -> KPCommand:
        @functools.wraps(f)
        def callback(**values):
            return f(settings_from(settings, values))

        attrs.setdefault("help", f.__doc__)
        return cls(name, callback=callback, params=parameters(settings), examples=examples,
                   exit_codes=exit_codes, sections=sections, section_of=sections_of(settings),
                   word=" " in name, **attrs)

    return decorator


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Inside, SIGTERM is a Ctrl-C (KeyboardInterrupt: files closed, locks released, exit
    130) instead of an instant death; an event loop may handle both itself meanwhile."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _debug_wanted(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("KP_DEBUG", "") not in ("", "0")


def _silence_stdout() -> None:
    # After EPIPE, Python would still try to flush stdout at exit and print a warning.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def run_command(command: click.Command) -> Callable[[], None]:
    """Wrap a click command as a console_scripts entry point with kimipipe's conventions."""

    def main(argv: list[str] | None = None) -> None:
        args = sys.argv[1:] if argv is None else argv
        prog = command.name or os.path.basename(sys.argv[0])
        try:
            code = command.main(args=args, prog_name=prog, standalone_mode=False)
        except KPError as e:
            click.echo(f"{prog}: {redact(e.message)}", err=True)
            code = e.exit_code
        except click.exceptions.Abort:
            click.echo(f"{prog}: interrupted", err=True)
            code = ExitCode.INTERRUPTED
        except click.ClickException as e:
            e.show()
            code = e.exit_code
        except (BrokenPipeError, ClosedOutputPipe):
            _silence_stdout()
            code = ExitCode.OK
        except KeyboardInterrupt:
            click.echo(f"{prog}: interrupted; rerun the same command to resume", err=True)
            code = ExitCode.INTERRUPTED
        except Exception as e:  # a bug: one line unless asked for the traceback
            if _debug_wanted(args):
                click.echo(redact(traceback.format_exc()), err=True)
            else:
                click.echo(
                    f"{prog}: unexpected error: {type(e).__name__}: {redact(str(e))} "
                    "(rerun with --debug or KP_DEBUG=1 for the traceback)",
                    err=True,
                )
            code = ExitCode.ERROR
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        sys.exit(code if isinstance(code, int) else ExitCode.OK)

    return main
