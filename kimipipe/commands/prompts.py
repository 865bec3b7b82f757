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
from collections.abc import Iterator

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
from ..prompts import (
    Selection,
    content_hash,
    hash_id,
    make_prompt,
    prompt_shuffle_key,
    prompt_turns,
    with_system,
)
from ..records import encode_line
from ..sources import FORMATS, FormatError, read_source, source_id, to_messages


def _candidates(sources: list[tuple[str, str]], fmt: str, id_field: str, dataset: str,
                system: str | None, turns: str, counts: Selection) -> Iterator[tuple]:
    """(position, id or None, messages, meta, shown path, SourceRecord) for every prompt candidate."""
    for file_index, (path, shown) in enumerate(sources):
        for rec in read_source(path, fmt, shown):
            try:
                messages = to_messages(rec.obj, fmt)
                sid = source_id(rec.obj, id_field)
            except FormatError as e:
                raise InputError(rec.where(f"{e.message} at `{e.json_path}`"), shown, rec.line) from None
            found = False
            for k, conversation in prompt_turns(messages, turns):
                found = True
                conversation = with_system(conversation, system)
                pid = None if sid is None else (f"{sid}#{k}" if turns == "each" else sid)
                meta = rec.obj.get("meta") if isinstance(rec.obj, dict) else None
                # By element, not by line: a one-line JSON array holds every record on line 1.
                yield (file_index, rec.index, k), pid, conversation, meta, shown, rec
            if not found:
                counts.no_user_turn += 1


EXAMPLES = """
    kp-prompts sharegpt.json --dataset B3 -o B3.prompts.jsonl
    kp-prompts questions.txt --format text --dataset B4 -o B4.prompts.jsonl.zst
    kp-prompts a.jsonl b.json.zst --turns each --shuffle --seed 1 --limit 50000 | head -1
"""


@kp_command("kp-prompts", examples=EXAMPLES)
@input_argument(multiple=True)
@output_option("Output file (`-` = stdout; `.zst` compresses). Appears only when complete.")
@click.option("--dataset", default="", help="Dataset name to tag the records with (e.g. B3).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
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

        sel = Selection()

        def candidates():
            return _candidates(sources, fmt, id_field, dataset, system, turns, sel)

        # Pass one: validate everything, decide what is written.
        for position, pid, messages, _meta, shown, rec in candidates():
            if max_chars is not None and sum(len(m["content"]) for m in messages) > max_chars:
                sel.too_long += 1
                continue
            digest = content_hash(messages)
            hashed = pid is None
            if hashed:
                pid = hash_id(dataset, messages)
            if digest in sel.seen_content and not keep_duplicates:
                sel.duplicates += 1
                continue
            if hashed and pid in sel.seen_ids:  # --keep-duplicates: number the repeats
                n = 2
                while f"{pid}-{n}" in sel.seen_ids:
                    n += 1
                pid = f"{pid}-{n}"
            first = sel.seen_ids.get(pid)
            if first is not None:
                if first[0] != digest:
                    raise InputError(
                        rec.where(f"duplicate id {pid!r} with different content "
                                  f"(first seen at {first[1]}:{first[2]})"),
                        shown, rec.line)
                sel.duplicates += 1
                continue
            sel.seen_ids[pid] = (digest, shown, rec.line if not rec.element else
                                 f"{rec.line} (element {rec.index + 1})")
            sel.seen_content.add(digest)
            sel.kept[position] = pid

        chosen = list(sel.kept.items())
        if shuffle:
            chosen.sort(key=lambda item: prompt_shuffle_key(seed, item[1]))
        if limit is not None:
            chosen = chosen[:limit]
        rank = {position: i for i, (position, _pid) in enumerate(chosen)}
        del sel.seen_ids, sel.seen_content

        # Pass two: write.
        out = AtomicOutput(output)
        try:
            buffered: list[bytes | None] = [None] * len(rank) if shuffle else []
            for position, _pid, messages, meta, _shown, _rec in _candidates(
                    sources, fmt, id_field, dataset, system, turns, Selection()):
                i = rank.get(position)
                if i is None:
                    continue
                line_bytes = encode_line(make_prompt(sel.kept[position], dataset, messages, meta))
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
