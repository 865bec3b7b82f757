#!/usr/bin/env bash
# bench/vllm_ids.sh: the price of re-tokenizing, measured on a real vLLM (docs/servers.md).
#
# Serves a small open model under vLLM (>= 0.10.2) on one GPU, sends it N prompts through
# `kp-infer --server` (which asks for return_token_ids), and runs kp-tokenize on the answers:
# its "sampled IDs against re-encoding" lines are the figure for bench/README.md (how often,
# and by how many tokens, re-encoding the text differs from the IDs the model sampled).
#
#   MODEL_DIR=/models/Qwen3-0.6B bench/vllm_ids.sh          # the model, already on disk
#
# Settings (environment): MODEL_DIR (required: a local Hugging Face model directory; the
# machine needs no network), PRESET (kp-tokenize --preset, default qwen3), REASONING_PARSER
# (vLLM's, default qwen3), N (prompts, default 300), MAX_TOKENS (default 1024), PORT (8000),
# OUT (working directory, default /tmp/kp-vllm-ids), VLLM (the command, default `vllm`).
# Bounded: vLLM gets 420 s to come up, the run 300 s; everything lands in OUT.
set -euo pipefail
MODEL_DIR=${MODEL_DIR:?set MODEL_DIR to a local model directory, e.g. Qwen3-0.6B}
PRESET=${PRESET:-qwen3}
REASONING_PARSER=${REASONING_PARSER:-qwen3}
N=${N:-300}
MAX_TOKENS=${MAX_TOKENS:-1024}
PORT=${PORT:-8000}
OUT=${OUT:-/tmp/kp-vllm-ids}
VLLM=${VLLM:-vllm}
NAME=${NAME:-bench-model}  # the served model name kp-infer asks for
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$HERE/.venv/bin}
mkdir -p "$OUT"
rm -f "$OUT/responses.jsonl" "$OUT/tokens.jsonl"

"$VLLM" --version > "$OUT/vllm-version.txt" 2>&1 || true
"$VLLM" serve "$MODEL_DIR" --served-model-name "$NAME" --reasoning-parser "$REASONING_PARSER" \
  --port "$PORT" --max-model-len 4096 --gpu-memory-utilization 0.5 > "$OUT/vllm.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 420); do
  if curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null; then break; fi
  if ! kill -0 "$SERVER" 2>/dev/null; then echo "vLLM exited; see $OUT/vllm.log" >&2; tail -20 "$OUT/vllm.log" >&2; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null || { echo "vLLM did not come up in 420 s" >&2; exit 1; }

# N prompts of varied text: the bundled demo conversations' first user turns, repeated
# with a numbered twist so that no two are alike
"$BIN/python" - "$N" "$HERE/kimipipe/data/demo/sharegpt.json" > "$OUT/prompts.jsonl" <<'PY'
import json, sys
n, path = int(sys.argv[1]), sys.argv[2]
firsts = []
for conv in json.load(open(path, encoding="utf-8")):
    turns = conv.get("conversations") or conv.get("messages") or []
    for t in turns:
        if t.get("from") in ("human", "user") or t.get("role") == "user":
            firsts.append(t.get("value") or t.get("content") or "")
            break
firsts = [f for f in firsts if f] or ["Explain how a tokenizer splits words."]
for i in range(n):
    text = f"{firsts[i % len(firsts)]}\n\n(variant {i}: answer in a different style)"
    print(json.dumps({"id": f"v{i}", "dataset": "vllm", "messages": [{"role": "user", "content": text}]}, ensure_ascii=False))
PY

timeout 300 "$BIN/kp-infer" "$OUT/prompts.jsonl" -o "$OUT/responses.jsonl" --model "$NAME" \
  --max-tokens "$MAX_TOKENS" --server "http://127.0.0.1:$PORT/v1" --server-concurrency 128 \
  --summary-json "$OUT/infer-summary.json" 2> "$OUT/infer.log" || { tail -20 "$OUT/infer.log" >&2; exit 1; }
tail -12 "$OUT/infer.log"
"$BIN/python" -c "import json,sys; rs=[json.loads(l) for l in open(sys.argv[1])]; \
print(f'{sum(bool(r.get(\"sampled_ids\")) for r in rs)}/{len(rs)} answers came with sampled_ids')" \
  "$OUT/responses.jsonl"
"$BIN/kp-tokenize" "$OUT/responses.jsonl" --tokenizer "$MODEL_DIR" --preset "$PRESET" \
  -o "$OUT/tokens.jsonl" --rejects "$OUT/rejects.jsonl" 2> "$OUT/tokenize.log" || true
grep -v "rec/s\|rec \[" "$OUT/tokenize.log"
