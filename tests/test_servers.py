"""Self-hosted servers (docs/servers.md): the stand-in's vLLM and SGLang modes, `kp-infer
--server` alone and beside OpenRouter, resume across the two, and kp-tokenize on the
server's own sampled IDs (the exact-IDs path and the mismatch report)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request

import pytest
from conftest import BIN, TOKENIZER_KINDS, TOKENIZERS, kp, read_jsonl, tokenize_in_process
from helpers import stderr_after, wait_for, whole_lines

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
    # its reasoning in `reasoning` (vLLM's field since v0.11.2), not `reasoning_content`
    assert "reasoning_content" not in message
    assert tok.decode(choice["token_ids"], skip_special_tokens=False) == (
        message["reasoning"] + "</think>" + message["content"] + "<|im_end|>")
    assert plain["usage"]["completion_tokens"] == len(choice["token_ids"])

    events = sse_events(post(server.base_url + "/chat/completions",
                             {**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert events[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    streamed = [i for e in events for c in e["choices"] for i in c.get("token_ids", [])]
    assert streamed == choice["token_ids"]
    assert all(len(c["token_ids"]) >= 1 for e in events[1:] for c in e["choices"])
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == message["content"]
    assert "".join(c["delta"].get("reasoning") or "" for e in events for c in e["choices"]) == (
        message["reasoning"])
    assert events[-1]["choices"] == [] and events[-1]["usage"] == plain["usage"]

    # without return_token_ids: no IDs; thinking off: no reasoning, no </think>
    off = json.loads(post(server.base_url + "/chat/completions",
                          {**body, "return_token_ids": False,
                           "chat_template_kwargs": {"thinking": False}}))
    assert "prompt_token_ids" not in off and "token_ids" not in off["choices"][0]
    assert off["choices"][0]["message"]["reasoning"] is None


def test_vllm_mode_serves_none_of_openrouters_endpoints(standin):
    server = standin(mode="vllm")
    for path in ("/api/v1/credits", "/api/v1/key", "/v1/credits", "/v1/key",
                 f"/v1/models/{MODEL}/endpoints", "/api/v1/chat/completions"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + path, timeout=10)
        assert e.value.code == 404, path  # no such path (as vLLM's FastAPI app answers)
    models = json.loads(urllib.request.urlopen(server.base_url + "/models", timeout=10).read())
    assert MODEL in [m["id"] for m in models["data"]]


def test_sglang_mode_answers_as_sglang_does(standin, tok):
    """SGLang (serving_chat.py, v0.5.20): the IDs in `sglext` when asked (in the body, or in
    a `choices: []` chunk after the finish and before the usage); its return_token_ids per
    choice on a plain answer, and refused (400, its top-level ErrorResponse) on a stream."""
    server = standin(mode="sglang", noncanonical=0.0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi 東京"}],
            "chat_template_kwargs": {"thinking": True},
            "return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": "hi 東京"}], tokenize=True,
                                         add_generation_prompt=True, thinking=True,
                                         return_dict=False)
    plain = json.loads(post(server.base_url + "/chat/completions", body))
    message = plain["choices"][0]["message"]
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["sglext"]["input_ids"] == prompt_ids
    [output] = plain["sglext"]["output_ids"]  # one list per choice
    assert tok.decode(output, skip_special_tokens=False) == (
        message["reasoning_content"] + "</think>" + message["content"] + "<|im_end|>")

    events = sse_events(post(server.base_url + "/chat/completions",
                             {**body, "stream": True, "stream_options": {"include_usage": True}}))
    ext = [n for n, e in enumerate(events) if "sglext" in e]
    finish = [n for n, e in enumerate(events) if any(c.get("finish_reason") for c in e["choices"])]
    assert len(ext) == 1 and events[ext[0]]["choices"] == [] and finish[-1] < ext[0]
    assert events[ext[0]]["sglext"] == plain["sglext"] and "usage" in events[ext[0] + 1]
    assert not any("token_ids" in c for e in events for c in e["choices"])

    with pytest.raises(urllib.error.HTTPError) as refused:
        post(server.base_url + "/chat/completions",
             {"model": MODEL, "messages": body["messages"], "stream": True, "return_token_ids": True})
    error = json.loads(refused.value.read())
    assert refused.value.code == 400 and error["object"] == "error" and error["code"] == 400
    assert "return_token_ids is not supported with streaming" in error["message"]
    old = json.loads(post(server.base_url + "/chat/completions",
                          {"model": MODEL, "messages": body["messages"], "return_token_ids": True,
                           "chat_template_kwargs": {"thinking": True}}))
    assert old["choices"][0]["prompt_token_ids"] == prompt_ids and "sglext" not in old
    assert old["choices"][0]["token_ids"] == output
    models = json.loads(urllib.request.urlopen(server.base_url + "/models", timeout=10).read())
    assert {m["owned_by"] for m in models["data"]} == {"sglang"}


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
    def kill_the_doomed_server_mid_request():
        wait_for(lambda: doomed.stats()["held"] >= 1, "a request held by the doomed server", 60)
        doomed.proc.kill()
        doomed.proc.wait()

    stderr = stderr_after(proc, kill_the_doomed_server_mid_request)
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


def test_a_servers_refused_answer_is_said_as_a_servers(standin, tmp_path):
    """A server's answer without reasoning (thinking asked; the stand-in's `noreasoning`
    fault) is refused as any answer is, and the prompt is sent again, to a server: the
    summary says so, with no word of a provider ignored nor of money (a server has
    neither), and counts those refusals by server apart from OpenRouter's providers'."""
    server = standin(mode="vllm", faults={"noreasoning": 0.4})
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = kp("infer", write_prompts(tmp_path / "p.jsonl", 16), "-o", out, "--server",
           server.base_url, "--max-attempts", "12", "--backoff-base", "0.01", "--no-stream",
           "--summary-json", summary, env=no_openrouter_env())
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 16 and all(x["response"]["reasoning"] for x in records)
    # (the stand-in's count may hold one more: an attempt given up on under load)
    refused = sum(len(x["refused"]) for x in records)
    assert 1 <= refused <= server.stats()["faults"]["noreasoning"]
    name = f"127.0.0.1:{server.port}"
    assert f"  refused from the servers (not kept; sent again to a server): no_reasoning " \
           f"{name} {refused}" in r.stderr.splitlines(), r.stderr
    assert "provider ignored" not in r.stderr and "paid for" not in r.stderr, r.stderr
    data = json.loads(summary.read_text())
    assert data["server_refused"] == {"no_reasoning": {name: refused}} and data["refused"] == {}


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
    # discovery (GET /v1/models: only the run that was not refused) goes through the
    # run's own client
    assert server.stats()["user_agents"] == {"models": {"kimipipe": 1}, "completions": {"kimipipe": 2}}


def test_hybrid_run_money_caps_apply_to_the_openrouter_share(standin, tmp_path):
    server = standin(mode="vllm", request_log=True, latency=0.2)
    # no cost in OpenRouter's usage: each of its answers is settled by GET /generation
    openrouter = standin(request_log=True, ledger=True, latency=0.2, no_cost=1.0)
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
    assert {r["cost_source"] for r in theirs} == {"generation"}  # (through the Sources)
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
    t = tokenize_in_process(responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl",
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
    t = tokenize_in_process(responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl", "--workers", "1")
    assert t.code == 0, t.stderr
    port = f"127.0.0.1:{server.port}"
    assert (f"warning: server {port}: its prompt_token_ids differ from kimipipe's input_ids on "
            "4 of 4 rows") in t.stderr
    assert len(read_jsonl(tmp_path / "t.jsonl")) == 4
    strict = tokenize_in_process(responses, "--tokenizer", FAST, "-o", tmp_path / "s.jsonl",
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
    t = tokenize_in_process(responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl", "--workers", "1")
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


# -- SGLang's IDs, model names, records, preflight, money (docs/servers.md) --------------------

def host_port(server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_sglang_servers_ids_come_through_sglext(standin, tmp_path, stream):
    """kp-infer asks an SGLang server (its GET /v1/models: owned_by sglang) for its IDs its
    way, streamed or not (its return_token_ids would be refused on a stream), and
    kp-tokenize trains on them."""
    server = standin(mode="sglang", request_log=True, noncanonical=1.0)
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    responses = tmp_path / "r.jsonl"
    r = kp("infer", prompts, "-o", responses, "--server", server.base_url, stream,
           env=no_openrouter_env())
    assert r.code == 0, r.stderr
    for body in server.requests():
        assert body["return_input_ids_in_sglext"] is True
        assert body["return_output_ids_in_sglext"] is True and "return_token_ids" not in body
    records = read_jsonl(responses)
    assert len(records) == 4 and all(rec["sampled_ids"]["prompt"] for rec in records)
    t = tokenize_in_process(responses, "--tokenizer", FAST, "-o", tmp_path / "t.jsonl", "--workers", "1")
    assert t.code == 0, t.stderr
    by_id = {rec["id"]: rec for rec in records}
    for row in read_jsonl(tmp_path / "t.jsonl"):
        assert row["output_ids_source"] == "sampled"
        assert row["output_ids"] == by_id[row["id"]]["sampled_ids"]["output"]
        assert row["input_ids"] == by_id[row["id"]]["sampled_ids"]["prompt"]


def test_a_server_serving_the_model_under_another_name(standin, tmp_path):
    """vLLM's --served-model-name: the one name it serves is sent (found by GET /v1/models,
    or given as URL#NAME); the records name the run's --model; a name it does not serve,
    or a server that cannot say, is exit 2 before anything is sent."""
    server = standin(mode="vllm", request_log=True, served_model_name="kimi-local")
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    for n, arg in enumerate((server.base_url, server.base_url + "#kimi-local")):
        out = tmp_path / f"r{n}.jsonl"
        r = kp("infer", prompts, "-o", out, "--server", arg, env=no_openrouter_env())
        assert r.code == 0, r.stderr
        assert f"{host_port(server)} serves {MODEL} as 'kimi-local' (vllm)" in r.stderr
        records = read_jsonl(out)
        assert len(records) == 3 and {rec["model"] for rec in records} == {MODEL}
        assert all(rec["sampled_ids"]["output"] for rec in records)
    assert {b["model"] for b in server.requests()} == {"kimi-local"}
    sent = len(server.requests())
    wrong = kp("infer", prompts, "-o", tmp_path / "w.jsonl", "--server", server.base_url + "#kimi",
               env=no_openrouter_env())
    assert wrong.code == 2 and f"--server {server.base_url}#kimi: it serves kimi-local, not " \
        "#kimi; name the one to use as --server URL#NAME" in wrong.stderr, wrong.stderr
    # a URL where nothing serves /models (404): exit 2, the status said
    lost = kp("infer", prompts, "-o", tmp_path / "l.jsonl", "--server", server.base_url + "/nowhere",
              env=no_openrouter_env())
    assert lost.code == 2 and "/nowhere/models (what it serves) failed: HTTP 404" in lost.stderr, \
        lost.stderr
    server.stop()
    down = kp("infer", prompts, "-o", tmp_path / "d.jsonl", "--server", server.base_url,
              env=no_openrouter_env())
    assert down.code == 2 and "/models (what it serves) failed" in down.stderr, down.stderr
    assert len(server.requests()) == sent and not (tmp_path / "w.jsonl").exists()


def test_server_records_carry_no_openrouter_fields(standin, tmp_path):
    """Every field of a server's record against an OpenRouter record of the same hybrid run:
    the sampling as the server was sent it (no require_parameters, no reasoning object: the
    thinking switch as chat_template_kwargs), no bill, the server's names."""
    server = standin(mode="vllm", request_log=True, latency=0.2)
    openrouter = standin(request_log=True)
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    r = kp("infer", prompts, "-o", out, "--server", server.base_url, "--server-concurrency", "1",
           "--openrouter", "--concurrency", "2", "--temperature", "1.0",
           "--summary-json", tmp_path / "s.json", env=openrouter.env)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    mine = [rec for rec in records if rec["api"] == "127.0.0.1" and rec["provider"] == host_port(server)]
    theirs = [rec for rec in records if rec not in mine]
    assert mine and theirs
    common = {"max_tokens": 16384, "temperature": 1.0, "top_p": 0.95}
    for rec in theirs:
        assert rec["sampling"] == {**common, "reasoning": {"enabled": True}, "require_parameters": True}
    for rec in mine:
        assert rec["sampling"] == {**common, "chat_template_kwargs": {
            "thinking": True, "enable_thinking": True}}
        assert rec["model"] == MODEL and rec["generation_id"].startswith("chatcmpl-")
        assert rec["usage"]["cost"] == 0 and rec["cost_source"] == "server"
        assert rec["routing"] is None and rec["refused"] == [] and rec["attempts"] == 1
        assert rec["reasoning_source"] == "field" and rec["sampled_ids"]["output"]
        assert rec["usage"]["completion_tokens"] == len(rec["sampled_ids"]["output"])
        assert rec["usage"]["prompt_tokens"] == len(rec["sampled_ids"]["prompt"])
    for body in server.requests():
        assert not {"provider", "reasoning", "session_id", "usage"} & set(body)
    costs = json.loads((tmp_path / "s.json").read_text())["costs"]
    assert costs["server"] == len(mine) and costs["usage"] == len(theirs)


def test_preflight_with_servers_checks_what_a_server_run_assumes(standin, tmp_path):
    """--preflight with --server: each server's kind and served name, one answer each
    (checked as a server's: its IDs, no cost), thinking switched the other way; nothing of
    OpenRouter's read without --openrouter; with it, OpenRouter answers one too."""
    vllm = standin(mode="vllm", request_log=True, served_model_name="kimi-local")
    sglang = standin(mode="sglang", request_log=True)
    openrouter = standin(request_log=True, ledger=True)
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    env = {**no_openrouter_env(), "OPENROUTER_BASE_URL": openrouter.base_url}
    r = kp("infer", prompts, "-o", out, "--server", vllm.base_url, "--server", sglang.base_url,
           "--preflight", "2", "--json", env=env)
    assert r.code == 0, r.stderr
    report = json.loads(r.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["passed"] and all(c["verdict"] in ("pass", "skip") for c in report["checks"])
    assert "a vllm server serving moonshotai/kimi-k2.5 as 'kimi-local'" in \
        checks[f"server {host_port(vllm)}"]["detail"]
    assert "a sglang server" in checks[f"server {host_port(sglang)}"]["detail"]
    assert [a["source"] for a in report["answers"]] == [host_port(vllm), host_port(sglang)]
    for i in (1, 2):
        assert checks[f"answer {i}: sampled IDs"]["verdict"] == "pass"
        assert checks[f"answer {i}: cost"]["verdict"] == "skip"
    for server in (vllm, sglang):
        assert checks[f"{host_port(server)}: thinking off"]["verdict"] == "pass"
        switched = [b for b in server.requests() if b["chat_template_kwargs"]["thinking"] is False]
        assert len(switched) == 1 and switched[0]["max_tokens"] == 512
    assert not any(c.startswith(("endpoints table", "balance", "distillation")) for c in checks)
    assert openrouter.requests() == [] and openrouter.stats()["requests"] == 0
    kept = read_jsonl(out)  # the run's answers only (not the switched ones), the run skips them
    assert [rec["provider"] for rec in kept] == [host_port(vllm), host_port(sglang)]
    assert all(rec["sampled_ids"]["prompt"] and rec["cost_source"] == "server" for rec in kept)

    both = kp("infer", prompts, "-o", out, "--server", vllm.base_url, "--openrouter",
              "--preflight", "2", "--json", env=openrouter.env)
    assert both.code == 0, both.stderr
    report = json.loads(both.stdout)
    assert [a["source"] for a in report["answers"]] == [host_port(vllm), "openrouter"]
    assert {c["check"] for c in report["checks"]} >= {"endpoints table", "balance"}
    assert len(openrouter.ledger()) == 1 and report["spend"] == pytest.approx(
        openrouter.ledger()[0]["cost"])


def worst_case_request(openrouter, prompts, *args) -> float:
    plan = kp("infer", prompts, "--plan", "--json", *args, env=openrouter.env)
    assert plan.code == 0, plan.stderr
    return json.loads(plan.stdout)["cost"]["worst_case_request"]


def test_hybrid_servers_share_reserves_no_money(standin, tmp_path):
    """--max-cost caps OpenRouter's share only: a prompt sent to a server reserves nothing,
    so with room for no OpenRouter request at all the servers answer everything (and the
    OpenRouter ledger stays empty), and with room for about one, the server still takes as
    many prompts at once as its slots."""
    server = standin(mode="vllm")
    openrouter = standin(request_log=True, ledger=True)
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    worst = worst_case_request(openrouter, prompts, "--max-tokens", "2000")
    r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--server", server.base_url,
           "--server-concurrency", "2", "--openrouter", "--max-tokens", "2000",
           "--max-cost", f"{worst * 0.5:.8f}", env=openrouter.env)
    assert r.code == 0, r.stderr
    records = read_jsonl(tmp_path / "r.jsonl")
    assert len(records) == 8 and {rec["provider"] for rec in records} == {host_port(server)}
    assert openrouter.ledger() == [] and openrouter.requests() == []

    held = standin(mode="vllm")
    held.configure(hold_after=0)  # every request waits until released
    out = tmp_path / "h.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--server", held.base_url,
         "--server-concurrency", "2", "--openrouter", "--concurrency", "2",
         "--max-tokens", "2000", "--max-cost", f"{worst * 1.5:.8f}"],
        env={**os.environ, **openrouter.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def release_once_two_are_held():
        # two server prompts in flight with room for one OpenRouter worst case: they hold none
        wait_for(lambda: held.stats()["held"] >= 2, "two prompts held by the server", timeout=30)
        held.configure(hold_after=None)

    stderr = stderr_after(proc, release_once_two_are_held)
    assert proc.returncode == 0, stderr.decode()
    records = read_jsonl(out)
    assert len(records) == 8
    assert sum(rec["usage"]["cost"] for rec in records) == pytest.approx(
        sum(line["cost"] for line in openrouter.ledger()))
    assert sum(line["cost"] for line in openrouter.ledger()) <= worst * 1.5


def test_hybrid_prompts_of_a_dead_server_move_to_openrouter(standin, tmp_path):
    """The only server dies holding prompts: they move to OpenRouter (their worst case
    reserved then), and the prompts admitted after go there too; all answered once."""
    server = standin(mode="vllm")
    openrouter = standin(ledger=True, latency=0.05)
    server.configure(hold_after=0)
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--server", server.base_url,
         "--server-concurrency", "2", "--openrouter", "--concurrency", "2",
         "--backoff-base", "0.05", "--max-cost", "5"],
        env={**os.environ, **openrouter.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def kill_the_server_holding_two():
        wait_for(lambda: server.stats()["held"] >= 2, "two prompts held by the server", 60)
        server.proc.kill()
        server.proc.wait()

    stderr = stderr_after(proc, kill_the_server_holding_two)
    assert proc.returncode == 0, stderr.decode()
    records = read_jsonl(out)
    assert sorted(rec["id"] for rec in records) == sorted(f"q{i}" for i in range(6))
    assert all(rec["provider"] != host_port(server) and rec["usage"]["cost"] > 0
               and rec.get("sampled_ids") is None for rec in records)
    assert len(openrouter.ledger()) == 6  # each prompt answered once, by OpenRouter


# -- what a real vLLM showed (issue 46): each finding, taught to the stand-in ---------------

def test_servers_only_resume_after_kill_9_continues_each_conversation(standin, tmp_path):
    """A servers-only run killed (-9) mid-conversations, then resumed: every turn is asked
    once, each unfinished conversation goes on from the turn it reached (not turn 1), and
    the progress total is the turns left (it read `N/0` when the servers-only preparation
    forgot the output's conversations)."""
    from test_infer_conversations import make_conversations

    server = standin(mode="vllm", request_log=True)
    server.configure(hold_after=10)
    prompts = make_conversations(tmp_path / "p.jsonl", 8, turns=3)  # 24 turns
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--server",
                             server.base_url, "--server-concurrency", "4", "--quiet"],
                            env=no_openrouter_env())
    try:
        wait_for(lambda: len(whole_lines(out)) == 10 and server.stats()["held"] == 4
                 or proc.poll() is not None, "10 turns written and the next 4 held", 60)
        assert proc.poll() is None, "the run ended before the gate"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = read_jsonl(out)
    assert len(first) == 10 and any(x["turn"] > 1 for x in first)
    sent_first = len(server.requests())
    server.configure(hold_after=None)
    r = kp("infer", prompts, "-o", out, "--server", server.base_url, "--server-concurrency", "4",
           env=no_openrouter_env())
    assert r.code == 0, r.stderr
    ids = [x["id"] for x in read_jsonl(out)]
    assert len(ids) == len(set(ids)) == 24
    assert len(server.requests()) - sent_first == 24 - 10  # each turn not kept, once
    # (a conversation the first run finished is not counted again)
    assert "kp-infer: 14/14, conversations " in r.stderr, r.stderr


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_server_text_is_the_decode_of_its_ids_with_a_slow_tokenizer(standin, tmp_path, stream):
    """vLLM's `spaces_between_special_tokens` defaults to true, and with a slow tokenizer
    (Kimi's remote-code one) its text then has a space after the prompt's `<think>` and
    around `</think>` that no ID holds: every row's sampled IDs were rejected. kimipipe asks
    for false; the stand-in's vLLM mode does what vLLM does by default."""
    slow = TOKENIZER_KINDS["tiktoken"]
    server = standin(mode="vllm", tokenizer=slow, noncanonical=0.5, request_log=True)
    from kimipipe.tokenize.load import load_tokenizer
    tok = load_tokenizer(slow, trust_remote_code=True)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello 東京"}],
            "return_token_ids": True, "chat_template_kwargs": {"thinking": True}}
    plain = json.loads(post(server.base_url + "/chat/completions", body))
    message, ids = plain["choices"][0]["message"], plain["choices"][0]["token_ids"]
    assert message["reasoning"].startswith(" ") and message["content"].startswith(" ")
    assert tok.decode(ids, skip_special_tokens=False) == (
        message["reasoning"].strip() + "</think>" + message["content"].strip() + "<|im_end|>")
    exact = json.loads(post(server.base_url + "/chat/completions",
                            {**body, "spaces_between_special_tokens": False}))
    message = exact["choices"][0]["message"]
    assert tok.decode(ids, skip_special_tokens=False) == (
        message["reasoning"] + "</think>" + message["content"] + "<|im_end|>")

    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    responses = tmp_path / "r.jsonl"
    r = kp("infer", prompts, "-o", responses, "--server", server.base_url, stream,
           env=no_openrouter_env())
    assert r.code == 0, r.stderr
    assert all(b["spaces_between_special_tokens"] is False for b in server.requests()[2:])
    t = tokenize_in_process(responses, "--tokenizer", slow, "--trust-remote-code",
                            "-o", tmp_path / "t.jsonl", "--workers", "1")
    assert t.code == 0, t.stderr
    rows = read_jsonl(tmp_path / "t.jsonl")
    by_id = {rec["id"]: rec for rec in read_jsonl(responses)}
    assert len(rows) == 6
    for row in rows:
        assert row["output_ids_source"] == "sampled", row.get("sampled_fallback")
        assert row["output_ids"] == by_id[row["id"]]["sampled_ids"]["output"]


def test_a_servers_context_is_read_at_discovery_and_each_overflow_said(standin, tmp_path):
    """vLLM reports its context (`max_model_len`) in GET /v1/models, refuses max_tokens
    above it and a prompt past it (400), and answers a prompt that fits with what room is
    left (200, `length`). kp-infer reads it before sending: --max-tokens above it is exit 2
    naming both numbers and the option, nothing sent; a prompt that cannot fit is one
    permanent failure; a cut the context caused is marked `cut_by: context`."""
    server = standin(mode="vllm", request_log=True)
    long_text = "question 1: " + "explain the word tokenizer again " * 40
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "dataset": "D", "messages": [
        {"role": "user", "content": text}]}) + "\n" for i, text in enumerate(
        ["question 0: explain 東京", long_text, "word " * 3000])))

    def usage(text):
        answer = json.loads(post(server.base_url + "/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": text}],
            "chat_template_kwargs": {"thinking": True}}))
        return answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]

    (p0, c0), (p1, c1) = usage("question 0: explain 東京"), usage(long_text)
    context = p1 + c1 - 10  # the long prompt's answer is cut by 10 tokens; the short one fits
    assert p0 + c0 <= context < p1 + c1 and p1 < context
    server.configure(max_model_len=context, latency=0.3)
    models = json.loads(urllib.request.urlopen(server.base_url + "/models", timeout=10).read())
    assert models["data"][0]["max_model_len"] == context
    sent = len(server.requests())

    r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--server", server.base_url,
           env=no_openrouter_env())  # --max-tokens 16384, the default
    assert r.code == 2, r.stderr
    assert (f"--max-tokens 16,384 is more than 127.0.0.1:{server.port} can generate: its "
            f"context (max_model_len) is {context:,} tokens") in r.stderr
    assert len(server.requests()) == sent and not (tmp_path / "r.jsonl").exists()

    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = kp("infer", prompts, "-o", out, "--failures", failures, "--server", server.base_url,
           "--max-tokens", str(context), "--server-concurrency", "2",
           env={**no_openrouter_env(), "KP_PROGRESS_INTERVAL": "0.2"})
    assert r.code == 4, r.stderr
    records = {rec["id"]: rec for rec in read_jsonl(out)}
    assert records["q0"]["finish_reason"] == "stop" and records["q0"]["cut_by"] is None
    assert records["q1"]["finish_reason"] == "length" and records["q1"]["cut_by"] == "context"
    assert records["q1"]["usage"]["completion_tokens"] == context - p1
    [failed] = read_jsonl(failures)
    assert failed["id"] == "q2" and "maximum context length" in failed["message"]
    assert len(server.requests()) - sent == 3  # the prompt past the context: asked once
    # the progress lines: the servers' slots are the run's limit, and no 429 was met
    assert "in flight (max 2)" in r.stderr and "after 429s" not in r.stderr, r.stderr


def test_an_answer_ending_at_max_tokens_where_the_context_ends_too_is_not_the_contexts_cut(
        standin, tmp_path):
    """`cut_by: context` marks an answer the context stopped before --max-tokens would
    have: `length` with fewer tokens than max_tokens. An answer whose --max-tokens ends
    exactly where the server's context ends is the answer max_tokens lets the model give
    (cut_by null); one token more of --max-tokens and the context is what cut it."""
    server = standin(mode="vllm")
    long_text = "question 1: " + "explain the word tokenizer again " * 40
    answer = json.loads(post(server.base_url + "/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": long_text}],
        "chat_template_kwargs": {"thinking": True}}))
    p1, c1 = answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]
    context = p1 + c1 - 10  # the answer is 10 tokens longer than the room the context leaves
    server.configure(max_model_len=context)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "q1", "dataset": "D", "messages": [
        {"role": "user", "content": long_text}]}) + "\n")
    for max_tokens, cut_by in ((context - p1, None), (context - p1 + 1, "context")):
        out = tmp_path / f"r{max_tokens}.jsonl"
        r = kp("infer", prompts, "-o", out, "--server", server.base_url,
               "--max-tokens", str(max_tokens), env=no_openrouter_env())
        assert r.code == 0, r.stderr
        [record] = read_jsonl(out)
        assert record["finish_reason"] == "length" and record["cut_by"] == cut_by, (max_tokens, record)
        assert record["usage"]["completion_tokens"] == context - p1
