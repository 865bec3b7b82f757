"""Self-hosted servers (docs/servers.md): the stand-in's vLLM and SGLang modes, `kp-infer
--server` alone and beside OpenRouter, resume across the two, and kp-tokenize on the
server's own sampled IDs (the exact-IDs path and the mismatch report)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import BIN, TOKENIZERS, kp, read_jsonl

FAST = TOKENIZERS / "kimi-k2.5-mini-fast"
MODEL = "moonshotai/kimi-k2.5"


def no_openrouter_env() -> dict:
    """The environment with no OpenRouter key or URL: a --server run needs neither."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTER_")}


def write_prompts(path, n, start=0):
    path.write_text("".join(json.dumps({
        "id": f"q{i}", "dataset": "D",
        "messages": [{"role": "user", "content": f"question {i}: explain 東京 step {i}"}]}) + "\n"
        for i in range(start, start + n)))
    return path


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def sse_events(raw: bytes) -> list[dict]:
    return [json.loads(block[6:]) for block in raw.decode().split("\n\n")
            if block.startswith("data: {")]


@pytest.fixture(scope="module")
def tok():
    from kimipipe.tokenize.load import load_tokenizer
    return load_tokenizer(FAST)


def wait_for(predicate, what, timeout=60.0):
    """Wait on an observable state (a stand-in counter, a file), never on a fixed time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- the stand-in's modes ---------------------------------------------------------------------

def test_vllm_mode_returns_real_token_ids_plain_and_streamed(standin, tok):
    server = standin(mode="vllm", noncanonical=0.0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello 東京"}],
            "return_token_ids": True, "chat_template_kwargs": {"thinking": True}}
    plain = json.loads(post(server.base_url + "/chat/completions", body))
    choice = plain["choices"][0]
    message = choice["message"]
    assert "provider" not in plain and "cost" not in plain["usage"]
    # the IDs are the tokenizer's: the prompt its template, the turn reasoning</think>content<|im_end|>
    assert plain["prompt_token_ids"] == tok.apply_chat_template(
        [{"role": "user", "content": "hello 東京"}], tokenize=True, add_generation_prompt=True,
        thinking=True, return_dict=False)
    assert tok.decode(choice["token_ids"], skip_special_tokens=False) == (
        message["reasoning_content"] + "</think>" + message["content"] + "<|im_end|>")
    assert plain["usage"]["completion_tokens"] == len(choice["token_ids"])

    events = sse_events(post(server.base_url + "/chat/completions",
                             {**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert events[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    streamed = [i for e in events for c in e["choices"] for i in c.get("token_ids", [])]
    assert streamed == choice["token_ids"]
    assert all(len(c["token_ids"]) >= 1 for e in events[1:] for c in e["choices"])
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == message["content"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == plain["usage"]

    # without return_token_ids: no IDs; thinking off: no reasoning, no </think>
    off = json.loads(post(server.base_url + "/chat/completions",
                          {**body, "return_token_ids": False,
                           "chat_template_kwargs": {"thinking": False}}))
    assert "prompt_token_ids" not in off and "token_ids" not in off["choices"][0]
    assert off["choices"][0]["message"]["reasoning_content"] is None


def test_vllm_mode_serves_none_of_openrouters_endpoints(standin):
    server = standin(mode="vllm")
    for path in ("/api/v1/credits", "/api/v1/key", "/v1/credits", "/v1/key",
                 f"/v1/models/{MODEL}/endpoints", "/api/v1/chat/completions"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + path, timeout=10)
        assert e.value.code in (404, 405), path
    models = json.loads(urllib.request.urlopen(server.base_url + "/models", timeout=10).read())
    assert MODEL in [m["id"] for m in models["data"]]


def test_sglang_mode_returns_no_token_ids(standin):
    server = standin(mode="sglang")
    out = json.loads(post(server.base_url + "/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "return_token_ids": True}))
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["message"]["reasoning_content"]


def test_noncanonical_split_decodes_to_the_same_text(standin, tok):
    server = standin(mode="vllm", noncanonical=1.0)
    differ = 0
    for i in range(6):
        out = json.loads(post(server.base_url + "/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": f"split {i}"}],
            "return_token_ids": True, "chat_template_kwargs": {"thinking": False}}))
        ids = out["choices"][0]["token_ids"]
        content = out["choices"][0]["message"]["content"]
        assert tok.decode(ids, skip_special_tokens=False) == content + "<|im_end|>"
        canonical = tok(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        differ += ids[:-1] != canonical
    assert differ >= 3  # most answers carry a split that re-encoding does not give back


# -- kp-infer --server ------------------------------------------------------------------------

def test_several_servers_one_killed_mid_run(standin, tmp_path):
    """Two servers; the first is killed while it holds requests: they are retried on the
    other, every prompt is answered once, and no OpenRouter call or field is made."""
    doomed = standin(mode="vllm", request_log=True)
    alive = standin(mode="vllm", request_log=True, latency=0.05)
    doomed.configure(hold_after=1)  # its first answer goes through, the next ones wait
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--server", doomed.base_url,
         "--server", alive.base_url, "--server-concurrency", "2", "--backoff-base", "0.05",
         "--no-stream"],
        env=no_openrouter_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: doomed.stats()["held"] >= 1, "a request held by the doomed server")
        doomed.proc.kill()
        doomed.proc.wait()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()
    records = read_jsonl(out)
    assert sorted(r["id"] for r in records) == sorted(f"q{i}" for i in range(12))
    by = {r["provider"] for r in records}
    assert by <= {doomed.base_url.split("//")[1].split("/")[0],
                  alive.base_url.split("//")[1].split("/")[0]}
    assert sum(r["provider"].endswith(f":{alive.port}") for r in records) >= 11
    assert all(r["usage"]["cost"] == 0 and r["sampled_ids"]["output"] for r in records)
    # the survivor took the doomed server's share within its own --server-concurrency
    assert alive.stats()["max_in_flight"] <= 2
    for body in alive.requests() + doomed.requests():
        assert "provider" not in body and "reasoning" not in body
        assert body["chat_template_kwargs"]["thinking"] is True
        assert body["return_token_ids"] is True


def test_server_run_needs_no_key_and_refuses_money_caps(standin, tmp_path):
    server = standin(mode="vllm")
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--server", server.base_url,
           "--max-cost", "1", env=no_openrouter_env())
    assert r.code == 2 and "--max-cost" in r.stderr
    r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--server", server.base_url,
           env=no_openrouter_env())
    assert r.code == 0, r.stderr
    assert "balance" not in r.stderr and "endpoints table" not in r.stderr


def test_hybrid_run_money_caps_apply_to_the_openrouter_share(standin, tmp_path):
    server = standin(mode="vllm", request_log=True, latency=0.2)
    openrouter = standin(request_log=True, ledger=True, latency=0.2)
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    out = tmp_path / "r.jsonl"
    r = kp("infer", prompts, "-o", out, "--server", server.base_url, "--server-concurrency", "2",
           "--openrouter", "--concurrency", "2", "--max-cost", "5", env=openrouter.env)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert sorted(r["id"] for r in records) == sorted(f"q{i}" for i in range(16))
    mine = [r for r in records if r["provider"] == f"127.0.0.1:{server.port}"]
    theirs = [r for r in records if r not in mine]
    assert mine and theirs
    assert all(r["sampled_ids"] and r["usage"]["cost"] == 0 for r in mine)
    assert all(r.get("sampled_ids") is None and r["usage"]["cost"] > 0 for r in theirs)
    # OpenRouter's share carries its routing; the server's none of it
    assert all("provider" in b for b in openrouter.requests())
    assert all("provider" not in b for b in server.requests())
    spent = sum(line["cost"] for line in openrouter.ledger())
    assert sum(r["usage"]["cost"] for r in records) == pytest.approx(spent)
    # the summary gives each source's share and tokens/s
    sources = next(line for line in r.stderr.splitlines() if line.startswith("  sources: "))
    assert f"127.0.0.1:{server.port} {len(mine) / 16:.0%} (" in sources
    assert f"openrouter {len(theirs) / 16:.0%} (" in sources and "tok/s" in sources


def test_resume_by_id_across_servers_and_openrouter(standin, tmp_path):
    """A --server run stopped by its token budget, then resumed with OpenRouter beside it:
    nothing answered is asked again, both hosts' records stay in one output."""
    server = standin(mode="vllm", request_log=True)
    openrouter = standin(request_log=True)
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "r.jsonl"
    first = kp("infer", prompts, "-o", out, "--server", server.base_url, "--server-concurrency",
               "1", "--token-budget", "600", env=no_openrouter_env())
    assert first.code == 0, first.stderr
    answered = {r["id"] for r in read_jsonl(out)}
    assert 0 < len(answered) < 10
    openrouter.configure(latency=0.1)
    second = kp("infer", prompts, "-o", out, "--server", server.base_url, "--server-concurrency",
                "1", "--openrouter", "--concurrency", "2", env=openrouter.env)
    assert second.code == 0, second.stderr
    records = read_jsonl(out)
    assert sorted(r["id"] for r in records) == sorted(f"q{i}" for i in range(10))
    asked_again = [b for b in server.requests() + openrouter.requests()
                   if any(f"question {i}:" in b["messages"][-1]["content"] and f"q{i}" in answered
                          for i in range(10))]
    assert len(asked_again) == len(answered)  # each answered prompt was asked once, in run 1
    # a third run: everything is done, whichever host answered it
    third = kp("infer", prompts, "-o", out, "--server", server.base_url, "--openrouter",
               env=openrouter.env)
    assert third.code == 0 and "10 skipped" in third.stderr, third.stderr


# -- kp-tokenize on the sampled IDs -----------------------------------------------------------

@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_tokenize_uses_the_servers_sampled_ids(standin, tmp_path, tok, stream):
    server = standin(mode="vllm", noncanonical=1.0)
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    responses = tmp_path / "r.jsonl"
    r = kp("infer", prompts, "-o", responses, "--server", server.base_url, stream,
           env=no_openrouter_env())
    assert r.code == 0, r.stderr
    t = kp("tokenize", responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl",
           "--workers", "1")
    assert t.code == 0, t.stderr
    rows = read_jsonl(tmp_path / "t.jsonl")
    by_id = {rec["id"]: rec for rec in read_jsonl(responses)}
    differ = 0
    for row in rows:
        sampled = by_id[row["id"]]["sampled_ids"]
        assert row["output_ids"] == sampled["output"]
        assert row["input_ids"] == sampled["prompt"]
        assert row["output_ids_source"] == "sampled"
        # the re-encoding beside them spells the same text
        assert tok.decode(row["reencoded_ids"], skip_special_tokens=False) == \
            tok.decode(row["output_ids"], skip_special_tokens=False)
        differ += row["reencoded_ids"] != row["output_ids"]
    assert differ >= 4
    port = f"127.0.0.1:{server.port}"
    report = [line for line in t.stderr.splitlines() if port in line and " differ (" in line]
    assert len(report) == 1 and f"{differ}/8 differ" in report[0], t.stderr


def test_tokenize_warns_on_a_servers_prompt_ids_and_rejects_them_under_strict(standin, tmp_path):
    server = standin(mode="vllm", system_prompt="You are Kimi, an AI assistant.")
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    responses = tmp_path / "r.jsonl"
    assert kp("infer", prompts, "-o", responses, "--server", server.base_url,
              env=no_openrouter_env()).code == 0
    t = kp("tokenize", responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl", "--workers", "1")
    assert t.code == 0, t.stderr
    port = f"127.0.0.1:{server.port}"
    assert (f"warning: server {port}: its prompt_token_ids differ from kimipipe's input_ids on "
            "4 of 4 rows") in t.stderr
    assert len(read_jsonl(tmp_path / "t.jsonl")) == 4
    strict = kp("tokenize", responses, "--tokenizer", FAST, "-o", tmp_path / "s.jsonl",
                "--workers", "1", "--strict")
    assert strict.code == 2 and "prompt_token_ids are not kimipipe's input_ids" in strict.stderr


def test_tokenize_reencodes_sampled_ids_that_do_not_spell_the_text(standin, tmp_path):
    server = standin(mode="vllm")
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    responses = tmp_path / "r.jsonl"
    assert kp("infer", prompts, "-o", responses, "--server", server.base_url,
              env=no_openrouter_env()).code == 0
    records = read_jsonl(responses)
    records[0]["sampled_ids"]["output"] = records[0]["sampled_ids"]["output"][1:]  # a token lost
    responses.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    t = kp("tokenize", responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl", "--workers", "1")
    assert t.code == 0, t.stderr
    rows = {row["id"]: row for row in read_jsonl(tmp_path / "t.jsonl")}
    assert "output_ids_source" not in rows[records[0]["id"]]
    assert rows[records[1]["id"]]["output_ids_source"] == "sampled"
    assert "1 rows' sampled IDs failed the check and were re-encoded" in t.stderr


def test_make_passes_servers_and_money_caps_only_with_openrouter(tmp_path):
    """`make SERVERS=...`: each server's --server, no money cap without OPENROUTER=1 (kp-infer
    refuses one there), --openrouter and the caps with it (`make -n`: the command only)."""
    from conftest import REPO
    work = tmp_path / "work"
    work.mkdir()
    (work / "B3.prompts.jsonl").write_text("")

    def command(*variables):
        proc = subprocess.run(
            ["make", "-n", "-C", str(REPO), f"WORK={work}", "DATASETS=B3", "MAX_COST=5",
             *variables, f"{work}/B3.responses.done"],
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        line = next(x for x in proc.stdout.splitlines()
                    if "kp-infer" in x and "--plan" not in x and "-o" in x)
        return line.split()

    alone = command("SERVERS=http://gpu1:30000/v1 http://gpu2:30000/v1", "SERVER_CONCURRENCY=7")
    assert [alone[i + 1] for i, a in enumerate(alone) if a == "--server"] == [
        "http://gpu1:30000/v1", "http://gpu2:30000/v1"]
    assert alone[alone.index("--server-concurrency") + 1] == "7"
    assert "--openrouter" not in alone and "--max-cost" not in alone
    both = command("SERVERS=http://gpu1:30000/v1", "OPENROUTER=1")
    assert "--openrouter" in both and both[both.index("--max-cost") + 1] == "5"
    plain = command()
    assert "--server" not in plain and "--max-cost" in plain
