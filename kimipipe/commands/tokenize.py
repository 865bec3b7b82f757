"""kp-tokenize: response records in, the target model's exact token IDs out.

Usage:
    kp-tokenize B3.responses.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code -o B3.tokens.jsonl
    kp-tokenize responses.jsonl.zst --tokenizer ./kimi-k2.5 --trust-remote-code --drop-text \\
        --max-length 32768 --drop-long --rejects B3.rejects.jsonl | kp-shard --out shards/B3
    kp-tokenize r.jsonl --tokenizer Qwen/Qwen3-8B --preset qwen3 --no-thinking --strict

Schema (one JSON object per line): the response record's fields, passed through, plus
    {"prompt_tokens_delta": int?, "completion_tokens_delta": int?, "reasoning_source": str?,
     "input_ids": [int], "output_ids": [int], "over_max_length": true?}
`input_ids` is the record's messages rendered by the model's chat template with the
generation prompt (thinking on: ending `<think>`; --no-thinking: `<think></think>`), as the
serving stack tokenizes it. `output_ids` is the generated turn: for Kimi K2.5
`enc(reasoning) + [</think>] + enc(content) + [<|im_end|>]`; a `finish_reason: "length"`
turn ends where its text ends; any other finish_reason (`content_filter`, `error`, null) is
rejected: the turn did not end, so no end-of-turn token may follow it. --drop-text leaves
out `messages` and `response`.
Rejects file lines: {"id", "line", "reason"}; it is rewritten on each run, and as rejected
records are never in the output, a rerun tries them again and lists those that fail still.

Messages are rendered from their role and content, as kp-infer sends them. A message
carrying more that the template would render (`name`, `tool_calls`, `tool_call_id`,
non-text content parts, earlier turns' `reasoning_content` under a template that keeps
it) stops the command with PATH:LINE naming the field, unless --ignore-extra-fields
(kimipipe/tokenize/fields.py).

The deltas are the provider's usage counts minus kimipipe's (the completion's without the
structural tokens kp-tokenize inserts); the summary tabulates them per provider, warns
about a provider (or a template) that renders prompts otherwise, and --max-prompt-delta N
rejects rows further off (kimipipe/tokenize/deltas.py). A response with no reasoning whose
content holds one `</think>` and no `<think>` (no reasoning parser) has the text before it
as its reasoning (`reasoning_source: inline`; kimipipe/think_tags.py).

A record with the model's sampled IDs (a server's `sampled_ids`, or the `sampled_tokens` of
token logprobs, `kp-infer --logprobs`) gets them as `output_ids` where they prove out,
part by part (`output_ids_source` "sampled" or "partial", `sampled_parts`, `reencoded_ids`,
`resegmented`), else the re-encoding with `sampled_fallback` saying why; the summary
tabulates, per provider, how often re-encoding differs from what was sampled
(kimipipe/tokenize/resegment.py, docs/kp-tokenize.md).

Every row is verified (decode(input_ids + output_ids) == rendered prompt + rendered turn,
and no control token inside the model's text); failures go to --rejects and make the exit
code 4 (--strict: stop at the first one, exit 2). Streaming, bounded memory; --workers
processes keep the input order. With -o FILE, records whose id is already in FILE are
skipped and new ones appended (a torn last line is repaired first); rows of FILE the input
does not give (an earlier input's, e.g. a changed source's) refuse the run at its end,
exit 2, or are removed with --prune; --prompts P tokenizes only the answers to the prompts
of P (make passes the dataset's). FILE is locked for the
run (a second kp-tokenize on it exits 2), and a write the disk refuses leaves FILE ending
with its last whole record (exit 3: free space, rerun). A bad input line stops the command
with PATH:LINE (records before it are already written; rerun resumes).
Nothing is downloaded: --tokenizer is a directory or a name in the local Hugging Face cache.
`--check` loads the tokenizer and template as a run would and exits (no input read):
`make check` uses it to find a missing tokenizer before any money is spent.
"""

from __future__ import annotations

import click

from ..cli import kp_command, run_command
from ..errors import ExitCode
from ..io import (
    check_writable,
    iter_records,
    require_distinct,
)
from ..options import DEBUG, INPUT, OUTPUT, PARTITION, QUIET, CommandSettings, fields_for, option
from ..tokenize import fields
from ..tokenize.engine import Engine, Settings
from ..tokenize.load import prepare_tokenizer_dir
from ..tokenize.render import PRESETS
from ..tokenize.run import run_tokenize

EXAMPLES = """
    kp-tokenize B3.responses.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code \\
        -o B3.tokens.jsonl.zst --rejects B3.rejects.jsonl
    kp-tokenize r.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code --drop-text \\
        --max-length 32768 --drop-long | kp-shard --out shards/B3
    kp-tokenize r.jsonl --tokenizer Qwen/Qwen3-8B --preset qwen3 --no-thinking --strict
"""



class TokenizeSettings(CommandSettings):
    """kp-tokenize's command line, one field per option, in --help order."""

    input: str = INPUT()
    tokenizer_spec: str = option(
        "--tokenizer", required=True, metavar="DIR",
        help="The target model's tokenizer: a local directory, or a model name already in "
             "the local Hugging Face cache (nothing is downloaded).")
    output: str = OUTPUT(
        help="Output file (`-` = stdout; `.zst` compresses). An existing file is resumed.")
    trust_remote_code: bool = option(
        "--trust-remote-code", is_flag=True, fills=Settings,
        help="Run the tokenizer code the directory ships (Kimi K2.5's tokenization_kimi.py).")
    chat_template: str | None = option(
        "--chat-template", type=click.Path(exists=True, dir_okay=False), default=None,
        help="A Jinja chat template file to use instead of the directory's.")
    preset: str = option(
        "--preset", type=click.Choice(["auto", *PRESETS]), default="auto", show_default=True,
        fills=Settings,
        help="Layout of the generated turn; `auto` picks it from the tokenizer's tokens.")
    thinking: bool = option(
        "--thinking/--no-thinking", default=True, show_default=True, fills=Settings,
        help="How the prompts were rendered: with thinking (prompt ends <think>) or without.")
    drop_truncated: bool = option(
        "--drop-truncated", is_flag=True, fills=Settings,
        help="Leave out turns cut by finish_reason length.")
    max_length: int | None = option(
        "--max-length", type=click.IntRange(min=1), default=None, fills=Settings,
        help="Rows with more IDs in all are flagged (`over_max_length`), or dropped with --drop-long.")
    drop_long: bool = option(
        "--drop-long", is_flag=True, fills=Settings,
        help="With --max-length: leave longer rows out.")
    drop_text: bool = option(
        "--drop-text", is_flag=True, fills=Settings,
        help="Leave `messages` and `response` out of the output.")
    prompts: str | None = option(
        "--prompts", type=click.Path(exists=True, dir_okay=False, allow_dash=False), default=None,
        metavar="FILE",
        help="Tokenize only the answers to FILE's prompts (the current kp-prompts output): "
             "answers to prompts it no longer holds, or holds changed (an earlier source's), "
             "are left out and counted; the input keeps them (paid for).")
    prune: bool = option(
        "--prune", is_flag=True,
        help="Remove from -o FILE the rows this input (with --prompts, as filtered) does not "
             "give, left by an earlier input; without it such an output is refused (exit 2).")
    rejects: str | None = option(
        "--rejects", type=click.Path(allow_dash=False), default=None,
        help="Write records that fail verification here, with the reason (JSON lines).")
    strict: bool = option(
        "--strict", is_flag=True, fills=Settings,
        help="Stop at the first record that fails verification (exit 2).")
    ignore_extra_fields: bool = option(
        "--ignore-extra-fields", is_flag=True, fills=Settings,
        help="Render each message's role and content only, leaving out fields the template "
             "would render (name, tool_calls, tool_call_id, non-text parts, earlier turns' "
             "reasoning_content) instead of stopping at them.")
    max_prompt_delta: int | None = option(
        "--max-prompt-delta", type=click.IntRange(min=0), default=None, metavar="N",
        fills=Settings,
        help="Reject rows whose provider-counted usage.prompt_tokens is more than N "
             "away from len(input_ids) (rows with no provider count pass).")
    workers: int | None = option(
        "--workers", type=click.IntRange(min=1), default=None,
        help="Worker processes (default: all cores).")
    check: bool = option(
        "--check", is_flag=True,
        help="Load the tokenizer and chat template as a run would, say what was loaded "
             "(stdout), and exit: no input is read, no output written (`make check`).")
    partition: tuple[int, int] | None = PARTITION()
    quiet: bool = QUIET()
    debug: bool = DEBUG(fills=Settings)  # (run_command reads it too: tracebacks)


def _settings(o: TokenizeSettings) -> Settings:
    """The engine's settings: the chat template's text (--chat-template), then the
    tokenizer's directory, prepared."""
    template_text = None
    if o.chat_template:
        with open(o.chat_template, encoding="utf-8") as f:
            template_text = f.read()
    directory = prepare_tokenizer_dir(o.tokenizer_spec, o.trust_remote_code)
    return Settings(**fields_for(o, Settings), chat_template=template_text,
                    tokenizer_dir=str(directory))


@kp_command("kp-tokenize", settings=TokenizeSettings, examples=EXAMPLES)
def cli(o: TokenizeSettings) -> int:
    """Rebuild the token IDs the target model saw and produced, from response records."""
    input, output, rejects, quiet = o.input, o.output, o.rejects, o.quiet
    if o.drop_long and o.max_length is None:
        raise click.UsageError("--drop-long needs --max-length")
    if not o.check:
        require_distinct(output, input)
        check_writable(output, "-o")
        if rejects:
            require_distinct(rejects, input)
            require_distinct(rejects, output)
            check_writable(rejects, "--rejects")
    if not o.check and input != "-":
        # another stage's file (a prompts file) is named before the tokenizer loads, which
        # takes ~20 s for Kimi K2.5's (a pipe's first record is read by the run)
        next(iter_records(input, fields.DECODER, expect="response"))
    settings = _settings(o)
    if o.check:  # what a run would load, loaded and checked the same way; a report: stdout
        click.echo(f"kp-tokenize: {o.tokenizer_spec}: {Engine(settings).describe()}")
        return ExitCode.OK
    return run_tokenize(settings, input, output, rejects, workers=o.workers,
                        partition=o.partition, quiet=quiet, prompts=o.prompts, prune=o.prune)


main = run_command(cli)
