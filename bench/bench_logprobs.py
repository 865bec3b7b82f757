"""What token logprobs cost kp-infer: CPU per streamed chunk and record size, on against off.

    .venv/bin/python bench/bench_logprobs.py                    # all three parts (~3 min)
    .venv/bin/python bench/bench_logprobs.py --part parse       # the chunk parse alone (~20 s)
    .venv/bin/python bench/bench_logprobs.py --part run --requests 4000 --concurrency 2000
    .venv/bin/python bench/bench_logprobs.py --part size        # record encodings compared

Three parts, each printing JSON lines with the ratio of logprobs on to off measured in the
same run:

  parse   the streamed-chunk parse in this process (openrouter/answer.py `StreamAnswer`,
          the code a run runs): the same streams of OpenRouter-shaped chunks, one
          token each (a real provider's shape: `logprobs.content` with one entry of
          token, logprob, bytes, top_logprobs []) against the same chunks with
          `logprobs: null`; CPU per chunk, the answer's join at its end included. The
          tokens are Kimi K2.5's real tokens of public answers (../shared, or
          KP_KIMI_TOKENIZER), else the bundled mini tokenizer's.
  run     kp-infer itself, the real command at --concurrency 2000 against the stand-in (`--logprobs together`, routed there with
          `--only-provider together`), `--logprobs` against `--no-logprobs`, one after the
          other on the same prompts: CPU of kp-infer's whole process tree per streamed
          chunk, and the bytes per response record, with the `sampled_tokens` field's
          share of the text it covers. That provider streams a chunk per token in both
          runs (as a token-by-token server does): only the `logprobs` field differs. The
          stand-in's tokenizer is the bundled mini one (~2 bytes a token, CJK in bytes).
  size    the encodings a record could keep the tokens in, per byte of the text they
          spell (reasoning + content), plain and zstd-compressed, on the same real
          tokens: OpenRouter's own (JSON [token, bytes] per token), a JSON list of byte
          lists, token strings (cannot hold a token that is not whole UTF-8), base64 of
          the bytes with the lengths, and the lengths alone (the bytes being the text's:
          what kp-infer writes when the tokens spell the answer).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SHARED = REPO.parent / "shared"
SOURCES = SHARED / "public-sources"
REAL = Path(os.environ.get("KP_KIMI_TOKENIZER") or SHARED / "kimi-k2.5-tokenizer")
MINI = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-tiktoken"


def _oasst(node) -> list[str]:
    out = [node["text"]] if node.get("role") == "assistant" and node.get("text") else []
    for reply in node.get("replies") or ():
        out += _oasst(reply)
    return out


def texts() -> list[str]:
    """Answers as models write them, from the public files in ../shared/public-sources:
    MT-Bench's reference answers, Alpaca's English and Chinese demo outputs, OASST's
    assistant messages, GSM8K's worked answers (digits), Dolphin-R1's answers (reasoning)."""
    readers = {
        "fastchat_mt_bench_reference_answer_gpt4.jsonl": lambda r: [
            t for c in r.get("choices", []) for t in c.get("turns", [])],
        "oasst_en_100_message.jsonl": _oasst,
        "speculators_gsm8k.jsonl": lambda r: [r.get("answer", "")],
        "speculators_dolphin_r1.jsonl": lambda r: [
            m.get("value", "") for m in r.get("conversations", []) if m.get("from") == "gpt"],
    }
    out = []
    for name, read in readers.items():
        try:
            for line in open(SOURCES / name, encoding="utf-8"):
                out += read(json.loads(line))
        except (OSError, ValueError):
            pass
    for name in ("llamafactory_alpaca_en_demo.json", "llamafactory_alpaca_zh_demo.json"):
        try:
            out += [r.get("output", "") for r in json.load(open(SOURCES / name, encoding="utf-8"))]
        except (OSError, ValueError):
            pass
    return [t for t in out if isinstance(t, str) and t] or \
        ["The answer is 42.\n\nHere is why: 6 x 7 = 42. 数据 🙂"] * 50


def codec():
    """The real Kimi K2.5 tokenizer's codec when its files are there, else the bundled mini."""
    from kimipipe.tokenize.codec import make_codec
    from kimipipe.tokenize.load import load_tokenizer

    directory, label = MINI, "kimi-k2.5-mini-tiktoken (bundled)"
    if (REAL / "tiktoken.model").is_file():
        tmp = Path(tempfile.mkdtemp(prefix="kp-bench-tok-"))
        for f in REAL.iterdir():
            if f.is_file():
                (tmp / f.name).symlink_to(f.resolve())
        (tmp / "chat_template.jinja").write_bytes((MINI / "chat_template.jinja").read_bytes())
        directory, label = tmp, "Kimi K2.5 (real)"
    return make_codec(load_tokenizer(directory, trust_remote_code=True)), label


def token_pieces(c, text: str) -> list[bytes]:
    return c.token_bytes(c.encode_text([text])[0])


# -- parse ------------------------------------------------------------------------------------

HEAD = {"id": "gen-1-abc", "provider": "Together", "model": "moonshotai/kimi-k2.5",
        "object": "chat.completion.chunk", "created": 1700000000}


def chunk(piece: bytes, with_logprobs: bool, i: int) -> bytes:
    text = piece.decode("utf-8", "replace")
    choice = {"index": 0, "delta": {"role": "assistant", "content": text},
              "finish_reason": None, "native_finish_reason": None,
              "logprobs": ({"content": [{"token": text, "logprob": -0.0123 * (i % 97),
                                         "bytes": list(piece), "top_logprobs": []}],
                            "refusal": None} if with_logprobs else None)}
    return json.dumps({**HEAD, "choices": [choice]}, ensure_ascii=False).encode()


def streams(c, n_chunks: int) -> list[list[bytes]]:
    """Streams of N_CHUNKS one-token chunks each, cut from the texts' real tokens."""
    pieces = [p for t in texts() for p in token_pieces(c, t)]
    out = []
    for start in range(0, len(pieces) - n_chunks, n_chunks):
        out.append(pieces[start:start + n_chunks])
        if len(out) == 200:
            break
    return out


def parse_part(args) -> None:
    from kimipipe.kinds import AttemptKind
    from kimipipe.openrouter.answer import StreamAnswer

    c, name = codec()
    tail = [json.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                             "native_finish_reason": "stop", "logprobs": None}]}).encode(),
            json.dumps({**HEAD, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 100,
                                                         "cost": 0.001}}).encode(), b"[DONE]"]
    cases = {}
    for on in (False, True):
        cases[on] = [[chunk(p, on, i) for i, p in enumerate(s)] + tail for s in streams(c, args.chunks)]
    n_chunks = sum(len(s) for s in cases[False])

    def run(on: bool) -> float:
        t0 = time.process_time()
        for s in cases[on]:
            answer = StreamAnswer()
            for payload in s:
                result = answer.event(payload)
            assert result.kind == AttemptKind.OK and (result.token_lengths is not None) == on
        return time.process_time() - t0

    best = {False: float("inf"), True: float("inf")}
    ratios = []
    for _ in range(args.repeat):  # interleaved: the machine's noise hits both alike
        off, on = run(False), run(True)
        best[False], best[True] = min(best[False], off), min(best[True], on)
        ratios.append(on / off)
    ratios.sort()
    print(json.dumps({
        "part": "parse", "tokenizer": name, "streams": len(cases[False]),
        "chunks_per_stream": args.chunks + len(tail), "chunks": n_chunks,
        "us_per_chunk_off": round(1e6 * best[False] / n_chunks, 3),
        "us_per_chunk_on": round(1e6 * best[True] / n_chunks, 3),
        "ratio_best": round(best[True] / best[False], 3),
        "ratio_median": round(ratios[len(ratios) // 2], 3),
        "chunk_bytes_off": round(sum(map(len, (p for s in cases[False] for p in s))) / n_chunks, 1),
        "chunk_bytes_on": round(sum(map(len, (p for s in cases[True] for p in s))) / n_chunks, 1)}))


# -- run --------------------------------------------------------------------------------------

def run_part(args) -> None:
    from bench_infer import BIN, run_client, write_prompts

    from kimipipe.standin.testing import StandIn

    results = {}
    with tempfile.TemporaryDirectory(prefix="kp-bench-lp-") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, args.requests)
        for flag in ("--no-logprobs", "--logprobs"):
            out = tmp / f"out{flag}.jsonl"
            with StandIn(latency=args.latency, tokens_per_second=args.tokens_per_second,
                         ledger=True, logprobs={"together": "all"}, noncanonical=0.25,
                         workdir=tmp / f"standin{flag}") as server:
                env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
                cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                       server.base_url, "--concurrency", str(args.concurrency), "--max-tokens",
                       str(args.max_tokens), "--quiet", "--idle-timeout", "600",
                       "--only-provider", "together", flag]
                measured = run_client(cmd, env)
                ledger = server.ledger()
            # a --logprobs provider of the stand-in streams a chunk per sampled token (its
            # ledger lists them; a token ending inside a UTF-8 character shares the next
            # one's chunk, so this counts a few too many), one more to finish and one for
            # the usage, in both runs alike
            chunks = sum(len(x["sampled"]["reasoning"]) + len(x["sampled"]["content"]) + 2
                         for x in ledger)
            records = [json.loads(line) for line in open(out)]
            record_bytes = out.stat().st_size
            text = sum(len(((r["response"].get("reasoning") or "") + r["response"]["content"])
                           .encode()) for r in records)
            field = sum(len(json.dumps(r["sampled_tokens"], separators=(",", ":")))
                        for r in records if r.get("sampled_tokens"))
            results[flag] = {"cpu_s": measured["cpu_s"], "wall_s": measured["wall_s"],
                             "chunks": chunks, "records": len(records),
                             "bytes_per_record": record_bytes / len(records),
                             "text_bytes": text, "field_bytes": field,
                             "with_tokens": sum(bool(r.get("sampled_tokens")) for r in records),
                             "peak_rss_mb": measured["peak_rss_mb"]}
    off, on = results["--no-logprobs"], results["--logprobs"]
    per = {k: 1e6 * v["cpu_s"] / v["chunks"] for k, v in results.items()}
    print(json.dumps({
        "part": "run", "requests": args.requests, "concurrency": args.concurrency,
        "latency": args.latency, "tokens_per_second": args.tokens_per_second,
        "max_tokens": args.max_tokens,
        "cpu_us_per_chunk_off": round(per["--no-logprobs"], 2),
        "cpu_us_per_chunk_on": round(per["--logprobs"], 2),
        "cpu_ratio": round(per["--logprobs"] / per["--no-logprobs"], 3),
        "wall_s_off": round(off["wall_s"], 1), "wall_s_on": round(on["wall_s"], 1),
        "bytes_per_record_off": round(off["bytes_per_record"]),
        "bytes_per_record_on": round(on["bytes_per_record"]),
        "record_ratio": round(on["bytes_per_record"] / off["bytes_per_record"], 3),
        "sampled_tokens_over_text": round(on["field_bytes"] / max(1, on["text_bytes"]), 3),
        "answers_with_tokens": f"{on['with_tokens']}/{on['records']}",
        "peak_rss_mb_off": round(off["peak_rss_mb"]), "peak_rss_mb_on": round(on["peak_rss_mb"])}))


# -- size -------------------------------------------------------------------------------------

def size_part(args) -> None:
    import zstandard

    c, name = codec()
    all_texts = texts()
    totals: dict[str, list[int]] = {}
    text_total = [0, 0]
    partial = 0
    squeeze = zstandard.ZstdCompressor(level=3)
    for t in all_texts:
        pieces = token_pieces(c, t)
        raw = t.encode()
        text_total[0] += len(json.dumps(t, ensure_ascii=False).encode())
        text_total[1] += len(squeeze.compress(json.dumps(t, ensure_ascii=False).encode()))
        strings_ok = all(p.decode("utf-8", "replace").encode() == p for p in pieces)
        partial += not strings_ok
        lengths = [len(p) for p in pieces]
        options = {
            "openrouter_json": [{"token": p.decode("utf-8", "replace"), "bytes": list(p)} for p in pieces],
            "byte_lists": [list(p) for p in pieces],
            "token_strings": [p.decode("utf-8", "replace") for p in pieces],
            "base64_and_lengths": {"lengths": lengths, "data": base64.b64encode(raw).decode()},
            "lengths_only": {"lengths": lengths, "spells": "answer"},
        }
        for key, value in options.items():
            data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
            got = totals.setdefault(key, [0, 0])
            got[0] += len(data)
            got[1] += len(squeeze.compress(data))
    print(json.dumps({
        "part": "size", "tokenizer": name, "texts": len(all_texts),
        "text_json_bytes": text_total[0], "text_json_zstd_bytes": text_total[1],
        "texts_with_a_token_not_whole_utf8": partial,
        "per_text_byte": {k: round(v[0] / text_total[0], 3) for k, v in totals.items()},
        "per_text_byte_zstd": {k: round(v[1] / text_total[1], 3) for k, v in totals.items()}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["parse", "run", "size", "all"], default="all")
    parser.add_argument("--chunks", type=int, default=100, help="parse: token chunks per stream")
    parser.add_argument("--repeat", type=int, default=7, help="parse: interleaved repeats")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=4.0)
    parser.add_argument("--tokens-per-second", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=100)
    args = parser.parse_args()
    if args.part in ("parse", "all"):
        parse_part(args)
    if args.part in ("size", "all"):
        size_part(args)
    if args.part in ("run", "all"):
        run_part(args)


if __name__ == "__main__":
    main()
