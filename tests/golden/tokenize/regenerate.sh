#!/bin/sh
# Regenerates the kp-tokenize golden files; run from the repository root (see README.md here).
set -e
for k in fast tiktoken; do
  .venv/bin/kp-tokenize tests/golden/tokenize/responses.jsonl --tokenizer kimipipe/data/tokenizers/kimi-k2.5-mini-$k \
      --trust-remote-code --drop-text --workers 1 -q > tests/golden/tokenize/tokens.$k.jsonl
  .venv/bin/kp-tokenize tests/golden/tokenize/responses.no-thinking.jsonl --tokenizer kimipipe/data/tokenizers/kimi-k2.5-mini-$k \
      --trust-remote-code --drop-text --workers 1 -q --no-thinking > tests/golden/tokenize/tokens.no-thinking.$k.jsonl
done
