#!/bin/sh
# Regenerates the kp-tokenize golden files; run from the repository root (see README.md here).
set -e
for k in fast tiktoken; do
  .venv/bin/kp-tokenize tests/golden/tokenize/responses.jsonl --tokenizer kimipipe/data/tokenizers/kimi-k2.5-mini-$k \
      --trust-remote-code --drop-text --workers 1 -q > tests/golden/tokenize/tokens.$k.jsonl
  .venv/bin/kp-tokenize tests/golden/tokenize/responses.no-thinking.jsonl --tokenizer kimipipe/data/tokenizers/kimi-k2.5-mini-$k \
      --trust-remote-code --drop-text --workers 1 -q --no-thinking > tests/golden/tokenize/tokens.no-thinking.$k.jsonl
done
# Kimi K2.5's real tokenizer (no chat template of its own: the project's K2.5 template).
real=${KP_KIMI_TOKENIZER:-../shared/kimi-k2.5-tokenizer}
template=kimipipe/data/tokenizers/kimi-k2.5-mini-tiktoken/chat_template.jinja
.venv/bin/kp-tokenize tests/golden/tokenize/responses.jsonl --tokenizer "$real" --chat-template $template \
    --trust-remote-code --drop-text --workers 1 -q > tests/golden/tokenize/tokens.real.jsonl
.venv/bin/kp-tokenize tests/golden/tokenize/responses.no-thinking.jsonl --tokenizer "$real" --chat-template $template \
    --trust-remote-code --drop-text --workers 1 -q --no-thinking > tests/golden/tokenize/tokens.no-thinking.real.jsonl
