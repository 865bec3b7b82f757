"""kp-prompts: prompt sources (ShareGPT, OpenAI messages, Alpaca, prompt/text, plain text)
in, prompt records out.

Usage:
    kp-prompts sharegpt.json --dataset B3 > B3.prompts.jsonl
    kp-prompts questions.txt --format text --dataset B4 -o B4.prompts.jsonl
    kp-prompts a.jsonl b.json.zst --turns each --shuffle --seed 1 --limit 50000

Schema (one JSON object per line):
    {"id": str, "dataset": str, "messages": [{"role": "system"|"user"|"assistant",
     "content": str}], "meta": {...}?}

Two passes: the first reads every input whole and validates it, keeping only IDs and
content hashes (so a bad line stops the command before a single record is written); the
second writes. Standard input is spooled to a temporary file for the second pass.
`--shuffle` holds the selected prompts in memory to reorder them.
"""

from __future__ import annotations

import tempfile

import click

from ..cli import (
    common_options,
    counted,
    input_argument,
    kp_command,
    output_option,
    run_command,
    say,
)
from ..errors import InputError
from ..io import AtomicOutput, check_writable, spool_stdin
from ..prompts.formats import FORMAT_CHOICES
from ..prompts.selection import Reading, Selection, candidates, make_prompt, select, write_order
from ..records import encode_line

EXAMPLES = """
    kp-prompts sharegpt.json --dataset B3 -o B3.prompts.jsonl
    kp-prompts questions.txt --format text --dataset B4 -o B4.prompts.jsonl.zst
    kp-prompts a.jsonl b.json.zst --turns each --shuffle --seed 1 --limit 50000 | head -1
"""


@kp_command("kp-prompts", examples=EXAMPLES)
@input_argument(multiple=True)
@output_option("Output file (`-` = stdout; `.zst` compresses). Appears only when complete.")
@click.option("--dataset", default="", help="Dataset name to tag the records with (e.g. B3).")
@click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), default="auto", show_default=True,
              help="Source format; `auto` detects it per record; `text` is one prompt per line.")
@click.option("--id-field", default="id", show_default=True,
              help="Source field holding a record's own id (else IDs are content hashes).")
@click.option("--system", default=None, help="System message to prepend where a conversation has none.")
@click.option("--turns", type=click.Choice(["last", "each"]), default="last", show_default=True,
              help="One prompt per conversation (up to its last user turn), or one per user turn.")
@click.option("--keep-duplicates", is_flag=True, help="Keep prompts whose messages repeat an earlier one.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Write at most N prompts.")
@click.option("--shuffle", is_flag=True, help="Deterministic shuffle (with --seed) before --limit.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --shuffle.")
@click.option("--max-chars", type=click.IntRange(min=1), default=None,
              help="Skip prompts whose messages hold more than N characters in all.")
@common_options
def cli(inputs, output, dataset, fmt, id_field, system, turns, keep_duplicates, limit, shuffle,
        seed, max_chars, quiet, debug):
    """Read prompt sources (default: stdin) and write prompt records, one JSON per line."""
    inputs = list(inputs) or ["-"]
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

        reading = Reading(sources, fmt, id_field, system, turns)
        sel = select(reading, dataset, keep_duplicates, max_chars)  # pass one: validate, choose
        rank = write_order(sel, shuffle, seed, limit)

        # Pass two: write.
        out = AtomicOutput(output)
        try:
            buffered: list[bytes | None] = [None] * len(rank) if shuffle else []
            for c in candidates(reading, Selection()):
                i = rank.get(c.position)
                if i is None:
                    continue
                line_bytes = encode_line(make_prompt(sel.kept[c.position], dataset, c.messages, c.meta))
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
    skipped = []
    if sel.no_user_turn:
        skipped.append(f"{sel.no_user_turn:,} without a user turn")
    if sel.duplicates:
        skipped.append(counted(sel.duplicates, "duplicate"))
    if sel.too_long:
        skipped.append(f"{sel.too_long:,} longer than --max-chars")
    where = "" if output == "-" else f" to {output}"
    say(f"kp-prompts: wrote {counted(len(rank), 'prompt')}{where}"
        + (f"; skipped {', '.join(skipped)}" if skipped else ""), quiet)


main = run_command(cli)
