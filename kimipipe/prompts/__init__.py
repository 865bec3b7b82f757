"""kp-prompts' parts: dataset files in, prompt records out.

- reading.py: a source file's records (JSONL, a JSON array, plain text; `.zst` too), each
  with the line it starts on.
- formats/: one module per source format (ShareGPT, OpenAI messages, Alpaca, ...), listed
  in one table, FORMATS; each turns a record into a conversation.
- conversation.py: what a format gives (turns, roles, text) and FormatError.
- selection.py: which prompts a conversation gives (`--turns`), stable IDs, dedup,
  `--max-chars`, `--shuffle` and `--limit`.
The command itself (kimipipe/commands/prompts.py) only wires these together.
"""
