"""A command's options, each declared once, on the typed field it fills.

A command's settings are one dataclass; each field is one of its options (or its argument),
declared by `option(...)` or `argument(...)` with click's own arguments, and named as the
command reads it. The command function takes an instance, so a type checker sees every
setting (`settings.max_cost: float | None`):

    @dataclass(frozen=True, kw_only=True)
    class ShardSettings:
        inputs: list[str] = argument(nargs=-1, type=click.Path(allow_dash=True))
        seed: int = option("--seed", type=int, default=0, show_default=True, fills=ShardOptions,
                           help="Seed for --shuffle.")

    @kp_command("kp-shard", settings=ShardSettings, examples=...)
    def cli(s: ShardSettings): ... ShardOptions(**fields_for(s, ShardOptions)) ...

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
types it otherwise; tests/test_options.py holds the cases.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import click

# The key of an option's declaration in its field's metadata.
OPTION = "kimipipe.option"


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What `option`/`argument` put in a field's metadata: click's DECLS and CLICK
    arguments, the --help SECTION, the record it FILLS, a CONVERT on the value's way in."""

    decls: tuple[str, ...]
    click: dict[str, Any]
    argument: bool = False
    section: str | None = None
    fills: type | None = None
    convert: Callable[[Any], Any] | None = None

    def parameter(self, name: str) -> click.Parameter:
        if self.argument:
            return click.Argument([name], **self.click)
        return click.Option([*self.decls, name], **self.click)

    @property
    def many(self) -> bool:
        """Its value is several (a repeatable option, an argument of nargs=-1): a list."""
        return bool(self.click.get("multiple")) or self.click.get("nargs") == -1

    def flag(self, name: str) -> str:
        """How messages name it: its long flag (`--done`), or the argument (`INPUT`)."""
        return next((d for d in self.decls if d.startswith("--")), name.upper())


def option(*decls: str, section: str | None = None, fills: type | None = None,
           convert: Callable[[Any], Any] | None = None, secret: bool = False,
           **click_args: Any) -> Any:
    """A settings field filled by the click option DECLS (`"-o", "--output"`); CLICK_ARGS
    are click.option's (type, default, help, ...). SECRET: left out of the settings' repr
    (`--proxy` may hold a password)."""
    declaration = Declaration(tuple(decls), click_args, section=section, fills=fills,
                              convert=convert)
    return dataclasses.field(metadata={OPTION: declaration}, repr=not secret)


def argument(*, fills: type | None = None, convert: Callable[[Any], Any] | None = None,
             **click_args: Any) -> Any:
    """A settings field filled by the command's argument (click.argument's CLICK_ARGS)."""
    declaration = Declaration((), click_args, argument=True, fills=fills, convert=convert)
    return dataclasses.field(metadata={OPTION: declaration})


def declarations(settings: type) -> Iterator[tuple[str, Declaration]]:
    """(field name, its declaration) of each option of SETTINGS, in field order."""
    for f in dataclasses.fields(settings):
        if OPTION in f.metadata:
            yield f.name, f.metadata[OPTION]


def parameters(settings: type) -> list[click.Parameter]:
    """The click parameters of SETTINGS' fields, in field order."""
    return [declaration.parameter(name) for name, declaration in declarations(settings)]


def sections_of(settings: type) -> dict[str, str]:
    """Parameter name -> its --help section (the options that name one)."""
    return {name: d.section for name, d in declarations(settings) if d.section is not None}


def settings_from(settings: type, values: dict[str, Any]) -> Any:
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


def fields_for(settings: Any, record: type) -> dict[str, Any]:
    """The values of SETTINGS' options that fill RECORD's fields, by name: RECORD(**these)."""
    return {name: getattr(settings, name) for name, declaration in declarations(type(settings))
            if declaration.fills is record}


def _record_types(record: type) -> dict[str, str]:
    """RECORD's field names -> their annotations as written (a dataclass or a Struct)."""
    if dataclasses.is_dataclass(record):
        return {f.name: _annotation(f.type) for f in dataclasses.fields(record)}
    annotations: dict[str, Any] = {}
    for cls in reversed(record.__mro__):
        annotations.update(getattr(cls, "__annotations__", {}))
    return {name: _annotation(annotations.get(name)) for name in getattr(record, "__struct_fields__", ())}


def _annotation(kind: Any) -> str:
    if isinstance(kind, str):
        return kind
    if isinstance(kind, type) and not isinstance(kind, types.GenericAlias):
        return kind.__name__
    return repr(kind).replace("typing.", "")


def check_settings(command: str, settings: type, sections: Iterable[str] | None) -> None:
    """Refuse (TypeError, every problem named) SETTINGS that is no command's settings: see
    the module's text. SECTIONS: the command's --help sections, or None for one list."""
    titles = list(sections) if sections is not None else None
    problems = []
    flags: dict[str, str] = {}
    for f in dataclasses.fields(settings):
        declaration = f.metadata.get(OPTION)
        if declaration is None:
            problems.append(f"{command}: {settings.__name__}.{f.name} is no option "
                            "(declare it with option(...) or argument(...))")
            continue
        where = f"{command} {declaration.flag(f.name)}"
        for flag in (d for d in declaration.decls if d.startswith("-")):
            for each in flag.split("/"):
                if each in flags:
                    problems.append(f"{where}: {each} declared twice (also {flags[each]})")
                flags[each] = f.name
        if declaration.argument:
            pass
        elif titles is None and declaration.section is not None:
            problems.append(f"{where}: section {declaration.section!r}, but {command} lists "
                            "its options in one list")
        elif titles is not None and declaration.section not in titles:
            problems.append(f"{where}: no --help section (one of: {', '.join(titles)})")
        if declaration.fills is not None:
            record = declaration.fills
            fields = _record_types(record)
            if f.name not in fields:
                problems.append(f"{where}: fills {record.__name__}.{f.name}, which "
                                f"{record.__name__} lacks")
            elif fields[f.name] != _annotation(f.type):
                problems.append(f"{where}: {_annotation(f.type)} here, {fields[f.name]} in "
                                f"{record.__name__}.{f.name}")
    if problems:
        raise TypeError("; ".join(problems))
