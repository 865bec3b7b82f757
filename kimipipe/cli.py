"""What every kp-* command shares: option bundles, error handling, progress, exit codes.

A command module defines its click command with `@kp_command(NAME, examples=...)` (which
gives it `-h`/`--help`, `--version`, and a help ending with an Examples block and the exit
codes) and exposes `main = run_command(cli)`; the console_scripts in setup.cfg point at
`main`. A command with many options declares each of them once, in an `OptionTable`
(`kp_command(..., options=TABLE)`: its click declaration, the field it fills and its --help
section), and its function takes the parsed bundle. Summary lines count things with `counted(n, "record")` (`1 record`, `12,345
records`), so numbers and plurals read the same in every command. `run_command` turns expected failures
(KPError) into one line on stderr and their exit code, a closed stdout pipe
(`kp-prompts x | head -1`) into a quiet exit, Ctrl-C into exit 130, and anything else
into one line and exit 1; `--debug` or `KP_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from . import __version__
from .errors import ExitCode, KPError, keep_secret, redact
from .partition import parse_partition

if TYPE_CHECKING:
    from tqdm import tqdm

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


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`1 record`, `2 records`, `12,345 records`: how every summary line counts."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


class ClosedOutputPipe(Exception):
    """stdout's reader went away (`kp-... | head -1`): a quiet exit 0, not an error."""


class KPCommand(click.Command):
    """A kp-* command: `-h` and `--help`, `--version`, and a help that ends with an
    Examples block (lines kept as written) and the exit codes.

    A closed stdout pipe leaves the command as ClosedOutputPipe, which run_command turns
    into a quiet exit 0 (click itself would make an EPIPE exit 1, silently).
    """

    def __init__(self, *args, examples: str = "", exit_codes: str | None = None,
                 options: OptionTable | None = None, **kwargs):
        self.table = options
        settings = kwargs.setdefault("context_settings", {})
        settings.setdefault("help_option_names", ["-h", "--help"])
        super().__init__(*args, **kwargs)
        self.examples = textwrap.dedent(examples).strip("\n")
        self.exit_codes = exit_codes if exit_codes is not None else EXIT_CODES.get(self.name, "")
        # Last of the options, just before -h/--help.
        click.version_option(__version__, "--version", prog_name=self.name,
                             message="%(prog)s %(version)s",
                             help="Show the version and exit.")(self)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise ClosedOutputPipe() from None

    def format_options(self, ctx, formatter) -> None:
        """With an OptionTable: the options under the table's section headings, in its
        order; the command's own (--version, -h) close the last section."""
        if self.table is None:
            return super().format_options(ctx, formatter)
        sections: dict[str, list] = {title: [] for title in self.table.sections}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                sections[self.table.section_of(param.name) or self.table.sections[-1]].append(record)
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


def word_help(ctx: click.Context, args: list[str],
              words: dict[str, KPCommand | Callable[[], KPCommand]]) -> None:
    """`kp-shard stats -h`, `kp-infer report --help`: a word's own help (usage, options,
    examples, exit codes), not its parent's. WORDS: the word's help-only commands (or what
    makes one, when it takes its parent's options)."""
    if args and args[0] in words and any(a in ("-h", "--help") for a in args[1:]):
        command = words[args[0]]
        if not isinstance(command, click.Command):
            command = command()
        own = command.context_class(command, info_name=command.name, **command.context_settings)
        click.echo(command.get_help(own))
        ctx.exit(0)


def help_only(name: str, text: str, *, arguments: str, examples: str,
              options: tuple[tuple[str, str], ...] = (),
              params: list[click.Parameter] | tuple = ()) -> KPCommand:
    """A word's help as its own command (`word_help` prints it; the parent parses the word):
    OPTIONS as (flags, help) flags, PARAMS the parent's own options the word takes."""
    params = [click.Argument(["arguments"], nargs=-1, metavar=arguments), *params]
    params += [click.Option(flags.split(", "), is_flag=True, help=what) for flags, what in options]
    command = KPCommand(name, help=text, params=params, examples=examples)
    command.params = [p for p in command.params if p.name != "version"]  # the parent's flag
    return command


def kp_command(name: str, *, examples: str, exit_codes: str | None = None,
               cls: type[KPCommand] = KPCommand, options: OptionTable | None = None, **attrs):
    """`@click.command` for a kp-* command (see KPCommand). With OPTIONS (an OptionTable),
    the command's parameters are the table's, and the decorated function takes one
    argument: the parsed bundle (`Parsed`), not one parameter per option."""
    if options is None:
        return click.command(name=name, cls=cls, examples=examples, exit_codes=exit_codes, **attrs)
    make = click.command(name=name, cls=cls, examples=examples, exit_codes=exit_codes,
                         options=options, params=options.params(), **attrs)

    def decorator(f):
        @functools.wraps(f)
        def callback(**values):
            return f(Parsed(values))
        return make(callback)

    return decorator


# -- options declared once ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Derived:
    """Where an option's value goes when it is not copied as it is into one field: NAME
    says what is computed. COMPUTE(bundle) returns RECORD's fields it sets ({field: value});
    without a RECORD the command reads the options itself (a dispatch between modes, the
    messages), and there is nothing to compute."""

    name: str
    record: str | None = None
    compute: Callable[[Parsed], dict] | None = None


class Declared:
    """One parameter of a command, declared once: DECLS and CLICK as click.option (or, with
    ARGUMENT, click.argument) takes them; FILLS, the field its value goes to ("config.max_cost":
    record `config`'s field `max_cost`) or a Derived; SECTION, its --help heading; CONVERT,
    applied to the value on the way (a repeatable option fills a list without one).

    Used alone (`@output_option(...)`) it is a click decorator; an OptionTable takes it
    with its FILLS and SECTION (`.at(...)`, for the shared ones declared here)."""

    def __init__(self, *decls: str, fills: str | Derived | None = None, section: str | None = None,
                 convert: Callable[[Any], Any] | None = None, argument: bool = False, **click):
        self.decls, self.click, self.argument = decls, click, argument
        self.fills, self.section, self.convert = fills, section, convert
        self.name = self.make().name
        # how messages name it: its long flag (`--done`, not `done_files`), or the argument
        self.flag = next((d for d in decls if d.startswith("--")), self.name.upper())

    def make(self) -> click.Parameter:
        return (click.Argument if self.argument else click.Option)(list(self.decls), **self.click)

    def at(self, fills: str | Derived, section: str | None = None,
           convert: Callable[[Any], Any] | None = None) -> Declared:
        """This parameter, filling FILLS and listed under SECTION (the shared ones)."""
        return Declared(*self.decls, fills=fills, section=section, convert=convert,
                        argument=self.argument, **self.click)

    def value(self, values: dict) -> Any:
        value = values[self.name]
        if self.convert is not None:
            return self.convert(value)
        return list(value) if isinstance(value, tuple) and self.click.get("multiple") else value

    def __call__(self, f):
        return (click.argument if self.argument else click.option)(*self.decls, **self.click)(f)

    def __repr__(self) -> str:
        return f"Declared({self.flag})"


class Parsed:
    """A command's parsed options, one attribute each, named as click names them
    (`--max-cost` is `.max_cost`, `--done` is `.done_files`): what the command takes."""

    def __init__(self, values: dict):
        self.__dict__.update(values)

    def __repr__(self) -> str:  # names only: --proxy may hold a password
        return f"Parsed({', '.join(self.__dict__)})"


def _record_fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ()))  # a msgspec Struct


class OptionTable:
    """Every parameter of one command, each declared once (see Declared), and what follows
    from it: the click parameters (in the table's order), the --help sections (SECTIONS'
    order; an option's place within its section is its place in the table) and the fields
    of the records the command builds (RECORDS: name -> dataclass or Struct).

    The table refuses, when it is made (so at import, before any command runs), an option
    without a section among SECTIONS, a parameter without FILLS, a FILLS naming a record or
    field that does not exist, and two parameters filling one field."""

    def __init__(self, command: str, entries: Iterable[Declared], *, sections: Iterable[str],
                 records: dict[str, type]):
        self.command = command
        self.entries = list(entries)
        self.sections = list(sections)
        self.records = records
        self.by_name = {e.name: e for e in self.entries}
        problems = [f"{command} {e.flag}: declared twice" for e in self.entries
                    if self.by_name[e.name] is not e]
        filled: dict[str, str] = {}
        for e in self.entries:
            where = f"{command} {e.flag}"
            if not e.argument and e.section not in self.sections:
                problems.append(f"{where}: no --help section (one of: {', '.join(self.sections)})")
            if isinstance(e.fills, Derived):
                d = e.fills
                if (d.record is None) != (d.compute is None) or (d.record and d.record not in records):
                    problems.append(f"{where}: derivation {d.name!r} needs a record of "
                                    f"{sorted(records)} and a compute, or neither")
            elif isinstance(e.fills, str) and e.fills.count(".") == 1:
                record, field = e.fills.split(".")
                if record not in records or field not in _record_fields(records[record]):
                    problems.append(f"{where}: fills {e.fills}, which {sorted(records)} lack")
                elif e.fills in filled:
                    problems.append(f"{where}: fills {e.fills}, as {filled[e.fills]} does")
                filled[e.fills] = where
            else:
                problems.append(f"{where}: fills nothing (a record's field, or a Derived)")
        if problems:
            raise TypeError("; ".join(problems))

    def params(self) -> list[click.Parameter]:
        return [e.make() for e in self.entries]

    def section_of(self, name: str | None) -> str | None:
        entry = self.by_name.get(name or "")
        return entry.section if entry else None

    def derivations(self) -> list[Derived]:
        seen: list[Derived] = []
        for e in self.entries:
            if isinstance(e.fills, Derived) and e.fills not in seen:
                seen.append(e.fills)
        return seen

    def fields(self, record: str, bundle: Parsed) -> dict:
        """RECORD's fields from BUNDLE: the options filling them as they are (converted),
        then the derivations that set its fields (in table order)."""
        values = {}
        for e in self.entries:
            if isinstance(e.fills, str) and e.fills.split(".")[0] == record:
                values[e.fills.split(".")[1]] = e.value(bundle.__dict__)
        for d in self.derivations():
            if d.record == record and d.compute is not None:
                computed = d.compute(bundle)
                if set(computed) & set(values):
                    raise TypeError(f"{self.command}: derivation {d.name!r} sets "
                                    f"{sorted(set(computed) & set(values))}, filled by options")
                values.update(computed)
        return values


def input_argument(multiple: bool = False) -> Declared:
    """INPUT path(s); `-` (the default) is stdin; zstd is read transparently."""
    if multiple:
        return Declared("inputs", nargs=-1, type=click.Path(allow_dash=True), argument=True)
    return Declared("input", default="-", type=click.Path(allow_dash=True), argument=True)


def output_option(help_text: str = "Output file (`-` = stdout; `.zst` compresses).") -> Declared:
    return Declared("-o", "--output", default="-", show_default=True,
                    type=click.Path(allow_dash=True), help=help_text)


QUIET = Declared("-q", "--quiet", is_flag=True, help="No progress bars, warnings or summaries on stderr.")
DEBUG = Declared("--debug", is_flag=True, help="Show tracebacks of unexpected errors (or KP_DEBUG=1).")
# --quiet and --debug in a table: the command's Stderr reads --quiet, run_command --debug
MESSAGES = Derived("messages: --quiet silences stderr; run_command shows tracebacks with --debug")


def quiet_option(f):
    return QUIET(f)


def debug_option(f):
    return DEBUG(f)


def common_options(f):
    return quiet_option(debug_option(f))


PROGRESS_INTERVAL_ENV = "KP_PROGRESS_INTERVAL"
# Without the bar graphics: at 80 columns tqdm's bar squeezes to one character and the
# counts after it are cut off.
NARROW_FORMAT = "{desc}: {n_fmt}/{total_fmt} {percentage:.0f}% [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


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


def say(message: str, quiet: bool = False) -> None:
    """One warning or summary line on stderr (see `Stderr`)."""
    Stderr(quiet)(message)


def read_api_key(api_key_file: str | None, required: bool = True) -> str:
    """The OpenRouter key from --api-key-file or OPENROUTER_API_KEY (exit 2 when missing,
    or when it holds whitespace or a control character: sent in a header, a line break
    would end the header early, and HTTP libraries quote the bad value in their errors)."""
    key = _read_api_key(api_key_file, required)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key):
        where = f"--api-key-file {api_key_file}" if api_key_file else "OPENROUTER_API_KEY"
        raise KPError(f"the API key in {where} holds whitespace or a control character "
                      "(two lines?)", ExitCode.USAGE)
    return key


def _read_api_key(api_key_file: str | None, required: bool) -> str:
    if api_key_file:
        try:
            with open(api_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as e:
            raise KPError(f"cannot read --api-key-file {api_key_file}: {e.strerror}",
                          ExitCode.USAGE) from None
        if not key and required:
            raise KPError(f"--api-key-file {api_key_file} is empty", ExitCode.USAGE)
        keep_secret(key)  # no message may show it, wherever it came from
        return key
    key = os.environ.get("OPENROUTER_API_KEY", "").strip()
    if not key and required:
        raise KPError("no API key: set OPENROUTER_API_KEY or pass --api-key-file",
                      ExitCode.USAGE)
    return key


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


_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*$")


def parse_quantity(text: str, base: int = 1000) -> int:
    """`10M`, `500k`, `2.5m`, `1_000_000`, `1G` (base 1024 for sizes: `1GiB`) -> an integer."""
    m = _QUANTITY.match(str(text).replace("_", "").replace(",", ""))
    if not m:
        raise ValueError(f"{text!r} is not a number (suffixes K, M, G, T allowed)")
    power = " KMGT".index(m.group(2).upper() or " ")
    return int(round(float(m.group(1)) * base**power))


class Quantity(click.ParamType):
    """An integer option with an optional K/M/G/T suffix (decimal for counts, binary for bytes)."""

    def __init__(self, name: str, base: int, minimum: int = 1):
        self.name = name
        self.base = base
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            number = value
        else:
            try:
                number = parse_quantity(value, self.base)
            except ValueError as e:
                self.fail(str(e), param, ctx)
        if number < self.minimum:
            self.fail(f"{value!r} is below {self.minimum}", param, ctx)
        return number


COUNT = Quantity("count", 1000)
SIZE = Quantity("size", 1024)


class PartitionType(click.ParamType):
    name = "K/N"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            return parse_partition(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


# `--partition K/N`: only the IDs whose hash falls in part K of N (kimipipe/partition.py);
# `@partition_option`, or `partition_option.at(...)` in a table.
partition_option = Declared("--partition", type=PartitionType(), default=None,
                            help="Only the IDs whose hash falls in part K of N (one part per machine).")

