"""kp-prompts: prompt sources (the formats of FORMATS, kimipipe/prompts/formats/) in, prompt
records out. The formats, `--turns` and what is skipped: docs/kp-prompts.md; the parts:
kimipipe/prompts/.

Usage:
    kp-prompts sharegpt.json --dataset B3 > B3.prompts.jsonl
    kp-prompts questions.txt --format text --dataset B4 -o B4.prompts.jsonl
    kp-prompts a.jsonl b.json.zst --turns each --shuffle --seed 1 --limit 50000

Schema (one JSON object per line):
    {"id": str, "dataset": str, "messages": [{"role": "system"|"user"|"assistant",
     "content": str}], "follow_ups": [str]?, "meta": {...}?}

Two passes: the first reads every input whole and validates it, keeping only IDs and
content hashes (so a bad line stops the command before a single record is written); the
second writes. Standard input is spooled to a temporary file for the second pass.
`--shuffle` holds the selected prompts in memory to reorder them.
"""

from __future__ import annotations

import tempfile

import click

from ..cli import kp_command, run_command
from ..errors import InputError
from ..io import AtomicOutput, check_writable, spool_stdin
from ..options import DEBUG, INPUTS, OUTPUT, QUIET, CommandSettings, option
from ..prompts.formats import FORMAT_CHOICES, format_labels
from ..prompts.selection import Reading, Selection, candidates, make_prompt, select, write_order
from ..prompts.turns import TURNS
from ..records import encode_line
from ..terminal import counted, say

EXAMPLES = """
    kp-prompts sharegpt.json --dataset B3 -o B3.prompts.jsonl
    kp-prompts questions.txt --format text --dataset B4 -o B4.prompts.jsonl.zst
    kp-prompts a.jsonl b.json.zst --turns each --shuffle --seed 1 --limit 50000 | head -1
"""


class PromptsSettings(CommandSettings):
    """kp-prompts' command line, one field per option, in --help order."""

    inputs: list[str] = INPUTS()
    output: str = OUTPUT(
        help="Output file (`-` = stdout; `.zst` compresses). Appears only when complete.")
    dataset: str = option("--dataset", default="",
                          help="Dataset name to tag the records with (e.g. B3).")
    fmt: str = option(
        "--format", type=click.Choice(FORMAT_CHOICES), default="auto", show_default=True,
        help=f"Source format ({format_labels()}); `auto` detects it per record; `text` is one "
             "prompt per line.")
    id_field: str | None = option(
        "--id-field", default=None,
        help="Source field holding a record's own id (else IDs are content hashes). "
             "[default: id; MT-Bench: question_id; OpenAssistant: message_id]")
    system: str | None = option(
        "--system", default=None, help="System message to prepend where a conversation has none.")
    turns: str = option(
        "--turns", type=click.Choice(TURNS), default="all", show_default=True,
        help="all: one prompt per conversation, its first user turn with the later ones as "
             "follow_ups (the source's answers dropped); last: the conversation up to its "
             "last user turn; each: one prompt per user turn, with the source's history.")
    strict: bool = option(
        "--strict", is_flag=True,
        help="A record with a tool turn, a tool declaration or a non-text part is an error "
             "(by default it is skipped, and counted).")
    keep_duplicates: bool = option(
        "--keep-duplicates", is_flag=True,
        help="Keep prompts whose messages repeat an earlier one.")
    limit: int | None = option(
        "--limit", type=click.IntRange(min=0), default=None, help="Write at most N prompts.")
    shuffle: bool = option(
        "--shuffle", is_flag=True, help="Deterministic shuffle (with --seed) before --limit.")
    seed: int = option("--seed", type=int, default=0, show_default=True, help="Seed for --shuffle.")
    max_chars: int | None = option(
        "--max-chars", type=click.IntRange(min=1), default=None,
        help="Skip prompts whose messages and follow-ups hold more than N characters in all.")
    quiet: bool = QUIET()
    debug: bool = DEBUG()


@kp_command("kp-prompts", settings=PromptsSettings, examples=EXAMPLES)
def cli(o: PromptsSettings) -> None:
    """Read prompt sources (default: stdin) and write prompt records, one JSON per line."""
    inputs, output, dataset, shuffle, quiet = o.inputs, o.output, o.dataset, o.shuffle, o.quiet
    inputs = inputs or ["-"]
    if inputs.count("-") > 1:
        raise InputError("stdin (`-`) can be read only once")
    check_writable(output, "-o", in_place=False)
    with tempfile.TemporaryDirectory(prefix="kp-prompts-") as tmp:
        sources = []
        for path in inputs:
            if path == "-":
                sources.append((spool_stdin(tmp), "<stdin>"))
            else:
                sources.append((path, path))

        reading = Reading(sources, o.fmt, o.id_field, o.system, o.turns, o.strict)
        sel = select(reading, dataset, o.keep_duplicates, o.max_chars)  # pass one: validate, choose
        rank = write_order(sel, shuffle, o.seed, o.limit)

        # Pass two: write.
        out = AtomicOutput(output)
        requests = 0  # one per user turn: what make plan and kp-infer count
        try:
            buffered: list[bytes | None] = [None] * len(rank) if shuffle else []
            for c in candidates(reading, Selection()):
                i = rank.get(c.position)
                if i is None:
                    continue
                prompt = make_prompt(sel.kept[c.position], dataset, c)
                requests += 1 + len(prompt.follow_ups)
                line_bytes = encode_line(prompt)
                if shuffle:
                    buffered[i] = line_bytes
                else:
                    out.writer.write_line(line_bytes)
            for line_bytes in buffered:
                out.writer.write_line(line_bytes)
            out.commit()
        except BaseException:
            out.discard()
            raise
    skipped, shortened = sel.summary(), sel.shortened()
    where = "" if output == "-" else f" to {output}"
    # a conversation is one prompt and one request per user turn: both said, or a user
    # reads "1 prompt" here and "3 requests" in the plan
    turns = f" ({counted(requests, 'request')}, one per user turn)" if requests != len(rank) else ""
    say(f"kp-prompts: wrote {counted(len(rank), 'prompt')}{turns}{where}"
        + (f"; skipped {', '.join(skipped)}" if skipped else "")
        + (f"; {'; '.join(shortened)}" if shortened else ""), quiet)


main = run_command(cli)
