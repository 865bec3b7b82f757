"""A command's options, each declared once, on the typed field it fills.

A command's settings are one `CommandSettings` (a msgspec Struct): each field is one of its
options (or its argument), declared by `option(...)` or `argument(...)` with click's own
arguments, and named as the command reads it. The command function takes an instance, so
a type checker sees every setting (`settings.max_cost: float | None`):

    class ShardSettings(CommandSettings):
        inputs: list[str] = argument(nargs=-1, type=click.Path(allow_dash=True))
        seed: int = option("--seed", type=int, default=0, show_default=True, fills=ShardOptions,
                           help="Seed for --shuffle.")

    @kp_command("kp-shard", settings=ShardSettings, examples=...)
    def cli(s: ShardSettings): ... ShardOptions(**fields_for(s, ShardOptions)) ...

- The declaration stands where a default would (as `dataclasses.field(...)` does): only
  `settings_from` makes an instance, with every field given what click parsed.
- The field's name is the parameter's name: `--done` fills `done_files` when the field is
  called so. A repeatable option (or an argument taking several) fills a list; `convert=`
  changes the value on its way in (`--extra-body`'s JSON text into a dict).
- `fills=RECORD` sends the value on to RECORD's field of the same name (a dataclass or a
  msgspec Struct the command builds): `fields_for(settings, RECORD)` is those values. A
  value computed from several options is plain code in the command, reading the typed
  fields.
- `section=` is the option's --help heading when the command lists its options in
  sections (`kp_command(..., sections=[...])`); --help shows them section by section, in
  field order within each.

`check_settings` refuses, when the command is made (at import, before it runs), a field
that is no option, an option without one of the command's sections (or with one, when the
command has none), a flag declared twice, and a `fills=` whose record lacks the field or
types it otherwise; tests/test_options.py holds the cases. A Struct, not a dataclass: a
command's settings class is made at every start, and a Struct's costs a fiftieth of a
dataclass's (no generated code to compile).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import click
import msgspec

from .partition import parse_partition


class CommandSettings(msgspec.Struct):
    """A command's settings: subclass it, one field per option (see the module's text)."""

    def __repr__(self) -> str:  # names only: --proxy may hold a password
        return f"{type(self).__name__}({', '.join(self.__struct_fields__)})"


S = TypeVar("S", bound=CommandSettings)


class Declaration:
    """What `option`/`argument` declare: click's DECLS and CLICK_ARGS, the --help SECTION,
    the record it FILLS, a CONVERT on the value's way in."""

    __slots__ = ("decls", "click_args", "argument", "section", "fills", "convert")

    def __init__(self, decls: tuple[str, ...], click_args: dict[str, Any], *,
                 argument: bool = False, section: str | None = None, fills: type | None = None,
                 convert: Callable[[Any], Any] | None = None):
        self.decls, self.click_args, self.argument = decls, click_args, argument
        self.section, self.fills, self.convert = section, fills, convert

    def parameter(self, name: str) -> click.Parameter:
        if self.argument:
            return click.Argument([name], **self.click_args)
        return click.Option([*self.decls, name], **self.click_args)

    @property
    def many(self) -> bool:
        """Its value is several (a repeatable option, an argument of nargs=-1): a list."""
        return bool(self.click_args.get("multiple")) or self.click_args.get("nargs") == -1

    def flag(self, name: str) -> str:
        """How messages name it: its long flag (`--done`), or the argument (`INPUT`)."""
        return next((d for d in self.decls if d.startswith("--")), name.upper())


def option(*decls: str, section: str | None = None, fills: type | None = None,
           convert: Callable[[Any], Any] | None = None, **click_args: Any) -> Any:
    """A settings field filled by the click option DECLS (`"-o", "--output"`); CLICK_ARGS
    are click.option's (type, default, help, ...)."""
    return Declaration(tuple(decls), click_args, section=section, fills=fills, convert=convert)


def argument(*, fills: type | None = None, convert: Callable[[Any], Any] | None = None,
             **click_args: Any) -> Any:
    """A settings field filled by the command's argument (click.argument's CLICK_ARGS)."""
    return Declaration((), click_args, argument=True, fills=fills, convert=convert)


def _fields(settings: type[CommandSettings]) -> Iterator[tuple[str, Any]]:
    """(name, what stands where its default would) of each field, in order."""
    names, defaults = settings.__struct_fields__, settings.__struct_defaults__
    yield from zip(names, (None,) * (len(names) - len(defaults)) + tuple(defaults), strict=True)


def declarations(settings: type[CommandSettings]) -> Iterator[tuple[str, Declaration]]:
    """(field name, its declaration) of each option of SETTINGS, in field order."""
    for name, declared in _fields(settings):
        if isinstance(declared, Declaration):
            yield name, declared


def parameters(settings: type[CommandSettings]) -> list[click.Parameter]:
    """The click parameters of SETTINGS' fields, in field order."""
    return [declaration.parameter(name) for name, declaration in declarations(settings)]


def sections_of(settings: type[CommandSettings]) -> dict[str, str]:
    """Parameter name -> its --help section (the options that name one)."""
    return {name: d.section for name, d in declarations(settings) if d.section is not None}


def settings_from(settings: type[S], values: dict[str, Any]) -> S:
    """An instance of SETTINGS from click's parsed VALUES (converted, several as lists)."""
    given = {}
    for name, declaration in declarations(settings):
        value = values[name]
        if declaration.convert is not None:
            value = declaration.convert(value)
        elif declaration.many:
            value = list(value)
        given[name] = value
    return settings(**given)


def fields_for(settings: CommandSettings, record: type) -> dict[str, Any]:
    """The values of SETTINGS' options that fill RECORD's fields, by name: RECORD(**these)."""
    return {name: getattr(settings, name) for name, declaration in declarations(type(settings))
            if declaration.fills is record}


def _annotations(cls: type) -> dict[str, Any]:
    annotations: dict[str, Any] = {}
    for each in reversed(cls.__mro__):
        annotations.update(each.__dict__.get("__annotations__", {}))
    return annotations


def _record_types(record: type) -> dict[str, str]:
    """RECORD's field names -> their annotations as written (a dataclass or a Struct)."""
    if dataclasses.is_dataclass(record):
        return {f.name: _annotation(f.type) for f in dataclasses.fields(record)}
    annotations = _annotations(record)
    return {name: _annotation(annotations.get(name)) for name in getattr(record, "__struct_fields__", ())}


def _annotation(kind: Any) -> str:
    if isinstance(kind, str):
        return kind
    if isinstance(kind, type) and not isinstance(kind, types.GenericAlias):
        return kind.__name__
    return repr(kind).replace("typing.", "")


def check_settings(command: str, settings: type[CommandSettings], sections: Iterable[str] | None) -> None:
    """Refuse (TypeError, every problem named) SETTINGS that is no command's settings: see
    the module's text. SECTIONS: the command's --help sections, or None for one list."""
    titles = list(sections) if sections is not None else None
    problems = []
    flags: dict[str, str] = {}
    records: dict[type, dict[str, str]] = {}
    annotations = _annotations(settings)
    for name, declaration in _fields(settings):
        if not isinstance(declaration, Declaration):
            problems.append(f"{command}: {settings.__name__}.{name} is no option "
                            "(declare it with option(...) or argument(...))")
            continue
        where = f"{command} {declaration.flag(name)}"
        for flag in (d for d in declaration.decls if d.startswith("-")):
            for each in flag.split("/"):
                if each in flags:
                    problems.append(f"{where}: {each} declared twice (also {flags[each]})")
                flags[each] = name
        if declaration.argument:
            pass
        elif titles is None and declaration.section is not None:
            problems.append(f"{where}: section {declaration.section!r}, but {command} lists "
                            "its options in one list")
        elif titles is not None and declaration.section not in titles:
            problems.append(f"{where}: no --help section (one of: {', '.join(titles)})")
        if declaration.fills is not None:
            record = declaration.fills
            if record not in records:
                records[record] = _record_types(record)
            fields = records[record]
            if name not in fields:
                problems.append(f"{where}: fills {record.__name__}.{name}, which "
                                f"{record.__name__} lacks")
            elif fields[name] != _annotation(annotations.get(name)):
                problems.append(f"{where}: {_annotation(annotations.get(name))} here, "
                                f"{fields[name]} in {record.__name__}.{name}")
    if problems:
        raise TypeError("; ".join(problems))


# -- the options every command shares, as fields: `quiet: bool = QUIET()`, `QUIET(section=...)`

# INPUT path; `-` (the default) is stdin; zstd is read transparently. INPUTS: several
# (none: stdin).
INPUT = functools.partial(argument, default="-", type=click.Path(allow_dash=True))
INPUTS = functools.partial(argument, nargs=-1, type=click.Path(allow_dash=True))
OUTPUT = functools.partial(option, "-o", "--output", default="-", show_default=True,
                           type=click.Path(allow_dash=True),
                           help="Output file (`-` = stdout; `.zst` compresses).")
QUIET = functools.partial(option, "-q", "--quiet", is_flag=True,
                          help="No progress bars, warnings or summaries on stderr.")
# (run_command reads --debug from the command line itself, for the traceback)
DEBUG = functools.partial(option, "--debug", is_flag=True,
                          help="Show tracebacks of unexpected errors (or KP_DEBUG=1).")


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


# `--partition K/N`: only the IDs whose hash falls in part K of N (kimipipe/partition.py).
PARTITION = functools.partial(option, "--partition", type=PartitionType(), default=None,
                              help="Only the IDs whose hash falls in part K of N (one part per machine).")
