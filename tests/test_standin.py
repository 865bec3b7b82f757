"""The OpenRouter stand-in through real sockets: every endpoint, fault, routing rule, bill."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import MODEL, body, get, post, wait_for

from kimipipe.standin.answers import answer_for_request, expected_answer, user_text_sha256
from kimipipe.standin.providers import KIMI_K25
from kimipipe.standin.testing import StandIn


def stream_lines(server, payload, timeout=30.0):
    """(status, [raw SSE lines]) of a streamed completion, until the server ends it."""
    headers = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.stream("POST", server.base_url + "/chat/completions",
                      json={**payload, "stream": True}, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.text]
        return 200, [line for line in r.iter_lines() if line]


def chunks_of(lines):
    return [json.loads(line[len("data: "):]) for line in lines
            if line.startswith("data: ") and line != "data: [DONE]"]


def joined(chunks, field):
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


# -- the basic exchange ------------------------------------------------------------------

def test_plain_completion_is_the_expected_answer_and_is_billed(standin):
    server = standin(ledger=True)
    req = body("Explain EAGLE-3 drafters.", max_tokens=4000, seed=7)
    r = post(server, req)
    assert r.status_code == 200
    out = r.json()
    want = answer_for_request(req)
    msg = out["choices"][0]["message"]
    assert msg["content"] == want.content and msg["reasoning"] == want.reasoning
    assert msg["reasoning_details"] == [{"type": "reasoning.text", "text": want.reasoning,
                                         "format": "unknown", "index": 0}]
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["id"].startswith("gen-") and r.headers["X-Generation-Id"] == out["id"]
    assert out["object"] == "chat.completion" and out["model"] == MODEL
    digest = hashlib.sha256(b"Explain EAGLE-3 drafters.").hexdigest()
    assert digest[:12] in msg["content"]
    usage = out["usage"]
    ep = next(e for e in KIMI_K25 if e.provider_name == out["provider"])
    cost = want.prompt_tokens * ep.prompt + want.completion_tokens * ep.completion
    assert usage["cost"] == pytest.approx(cost)
    assert usage["cost_details"]["upstream_inference_cost"] == usage["cost"]
    assert usage["completion_tokens"] == want.completion_tokens
    assert usage["completion_tokens_details"]["reasoning_tokens"] == want.reasoning_tokens
    assert usage["total_tokens"] == want.prompt_tokens + want.completion_tokens
    stats = server.stats()
    assert stats["charged"] == 1 and stats["total_usage"] == pytest.approx(cost)
    assert stats["balance_remaining"] == pytest.approx(100 - cost)
    assert stats["statuses"] == {"200": 1}
    [line] = server.ledger()
    assert line.pop("endpoint") in {e.tag for e in KIMI_K25 if e.provider_name == out["provider"]}
    assert line == {"generation_id": out["id"], "provider": out["provider"], "model": MODEL,
                    "prompt_tokens": want.prompt_tokens,
                    "completion_tokens": want.completion_tokens,
                    "reasoning_tokens": want.reasoning_tokens, "cost": pytest.approx(cost),
                    "finish_reason": "stop", "request_user_text_sha256": digest}


def test_stream_joins_back_to_the_plain_answer(standin):
    server = standin(latency=0.3, keepalive_interval=0.1, tokens_per_second=2000)
    req = body("Stream me something", max_tokens=5000)
    status, lines = stream_lines(server, req)
    assert status == 200
    assert lines[0] == ": OPENROUTER PROCESSING"          # keep-alive while "thinking"
    assert lines[-1] == "data: [DONE]"
    chunks = chunks_of(lines)
    want = answer_for_request(req)
    assert joined(chunks, "content") == want.content
    assert joined(chunks, "reasoning") == want.reasoning
    details = "".join(d["text"] for c in chunks if c["choices"]
                      for d in c["choices"][0]["delta"].get("reasoning_details", []))
    assert details == want.reasoning
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("gen-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL
               and c["provider"] and c["created"] for c in chunks)
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["cost"] > 0
    assert last["usage"]["cost_details"]["upstream_inference_cost"] == last["usage"]["cost"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    # one token per content-bearing chunk
    assert sum(1 for c in chunks if c["choices"] and (c["choices"][0]["delta"].get("content")
               or c["choices"][0]["delta"].get("reasoning"))) == want.completion_tokens
    assert server.stats()["charged"] == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_server_cli_port_file_and_clean_stop(tmp_path, sig):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "kimipipe.standin", "--port-file",
                             str(port_file)], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        port = int(port_file.read_text())
        assert line.strip() == f"listening on http://127.0.0.1:{port}"
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/credits",
                      headers={"Authorization": "Bearer sk-or-standin"})
        assert r.json() == {"data": {"total_credits": 100.0, "total_usage": 0.0}}
    finally:
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    assert not list(tmp_path.glob("port.tmp*"))


def test_cli_host_and_a_tokenizer_without_a_template(tmp_path):
    """--host binds another address (here IPv6 loopback, in the URL it prints); a tokenizer
    directory without a chat template is one line and exit 2 (as kp-tokenize says it), and
    --chat-template FILE supplies one: prompts are counted with it."""
    import shutil

    bundled = Path(__file__).resolve().parent.parent / "kimipipe/data/tokenizers/kimi-k2.5-mini-fast"
    bare = tmp_path / "bare"
    shutil.copytree(bundled, bare)
    (bare / "chat_template.jinja").unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "kimipipe.standin", "--tokenizer", str(bare)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()  # one line, kp-tokenize's words
    assert line.startswith(f"standin: the tokenizer in {bare} has no chat template: the model's "
                           "is its repository's chat_template.jinja (") and "hf download" in line
    assert line.endswith("or pass --chat-template FILE")
    template = tmp_path / "template.jinja"
    template.write_text((bundled / "chat_template.jinja").read_text().replace(
        "<|im_user|>", "<|im_user|><|im_user|><|im_user|>"))  # 2 more tokens per user turn
    counts = {}
    for name, args in (("own", ["--tokenizer", str(bundled)]),
                       ("given", ["--tokenizer", str(bare), "--chat-template", str(template)])):
        proc = subprocess.Popen([sys.executable, "-m", "kimipipe.standin", "--host", "::1", *args],
                                stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline().strip()
            assert line.startswith("listening on http://[::1]:"), line
            base = line.removeprefix("listening on ") + "/api/v1"
            r = httpx.post(f"{base}/chat/completions", json=body("Hi"),
                           headers={"Authorization": "Bearer sk-or-standin"}, timeout=60)
            assert r.status_code == 200, r.text
            counts[name] = r.json()["usage"]["prompt_tokens"]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    assert counts["given"] == counts["own"] + 2


@pytest.mark.parametrize("args, message", [
    (["--fault", "teapot=0.5"], "unknown fault kind 'teapot'"),
    (["--fault", "429=1.5"], "must be in [0, 1]"),
    (["--fault", "429"], "expected KIND=RATE"),
    (["--fault", "429=0.6", "--fault", "500=0.6"], "sum to at most 1"),
])
def test_cli_rejects_bad_faults(args, message):
    proc = subprocess.run([sys.executable, "-m", "kimipipe.standin", *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.parametrize("start", ["exec", "fork"])
def test_standin_class_as_context_manager(start):
    with StandIn(balance=3, start=start) as server:
        assert get(server, "/credits").json()["data"]["total_credits"] == 3.0
        pid = server.pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        # exec'd: the command a user runs; forked: this process's own command line
        assert (cmdline[1:3] == [b"-m", b"kimipipe.standin"]) == (start == "exec"), cmdline
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid == os.getpid()  # a child of this process either way, reaped by stop()
    assert server.proc is None and pid
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped: no zombie left


# -- a shared server for the many small cases (each test sets the faults it needs) ---------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    server = StandIn(workdir=tmp_path_factory.mktemp("standin-shared"), ledger=True,
                     keepalive_interval=0.05, hang_seconds=30)
    with server:
        yield server


@pytest.fixture
def srv(shared):
    shared.configure(faults={}, balance=100.0, key_limit=None, latency=0.0, bill_cancelled=False,
                     tokens_per_second=0.0, credits_mode="normal", price_scale=1.0)
    return shared


# -- validation and auth -----------------------------------------------------------------

@pytest.mark.parametrize("key, message", [("", "No auth credentials found"),
                                          ("sk-or-wrong", "User not found.")])
@pytest.mark.parametrize("path", ["/chat/completions", "/credits", "/key", "/auth/key",
                                  "/generation?id=gen-1"])
def test_bad_key_is_401_everywhere(srv, path, key, message):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if path == "/chat/completions":
        r = httpx.post(srv.base_url + path, json=body(), headers=headers)
    else:
        r = httpx.get(srv.base_url + path, headers=headers)
    assert r.status_code == 401
    assert r.json() == {"error": {"code": 401, "message": message}}
    assert "sk-or-wrong" not in r.text


@pytest.mark.parametrize("payload, raw, needle", [
    (None, b"{not json", "Invalid JSON"),
    ({"model": MODEL}, None, "messages"),
    ({"model": MODEL, "messages": []}, None, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, None, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}]}, None, "model"),
    (body(provider={"ignore": ["fireworks"], "prefer": ["x"]}), None, "prefer"),
    (body(provider={"ignore": "fireworks"}), None, "provider.ignore"),
    (body(provider={"quantizations": ["int3"]}), None, "quantizations"),
    (body(provider={"sort": "vibes"}), None, "provider.sort"),
    (body(max_tokens=0), None, "max_tokens"),
    (body(stream="yes"), None, "stream"),
    ({**body(), "model": "moonshotai/kimi-k9"}, None, "not a valid model ID"),
])
def test_bad_requests_are_400(srv, payload, raw, needle):
    before = srv.stats()
    r = post(srv, payload, raw=raw)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and needle in err["message"]
    after = srv.stats()
    assert after["completions_started"] == before["completions_started"]
    assert after["statuses"]["400"] == before["statuses"].get("400", 0) + 1


# -- routing -----------------------------------------------------------------------------

@pytest.mark.parametrize("prefs, provider", [
    ({"sort": "price"}, "deepinfra/turbo"),                       # the trap: re-quantized
    ({"only": ["together"]}, "Together"),
    ({"only": ["Moonshot AI"]}, "Moonshot AI"),                   # provider_name matches
    ({"ignore": ["deepinfra"], "sort": "price"}, "Fireworks"),    # base slug takes variants
    ({"ignore": ["DEEPINFRA/turbo", "Fireworks", "baseten"], "sort": "price"}, "DeepInfra"),
    ({"quantizations": ["int4"], "sort": "price"}, "DeepInfra"),
    ({"quantizations": ["int4", "unknown"], "order": ["moonshotai", "together"]}, "Moonshot AI"),
    ({"order": ["parasail", "together"], "allow_fallbacks": False}, "Parasail"),
    ({"order": ["nobody", "together"]}, "Together"),
    ({"max_price": {"prompt": 0.5, "completion": 2.8}, "sort": "throughput"}, "Fireworks"),
    ({"quantizations": ["int4"], "sort": "throughput"}, "Together"),
    ({"sort": "latency", "ignore": ["fireworks"]}, "deepinfra/turbo"),
    ({"sort": {"by": "price"}, "only": ["parasail", "together"]}, "Parasail"),
])
def test_routing_honours_provider_preferences(srv, prefs, provider):
    r = post(srv, body(provider=prefs, max_tokens=100))
    assert r.status_code == 200, r.text
    if "/" in provider:  # a variant: the answer names its provider, never its tag
        assert r.json()["provider"] == "DeepInfra"
    else:
        assert r.json()["provider"] == provider


@pytest.mark.parametrize("prefs", [
    {"only": ["nobody"]},
    {"quantizations": ["int8"]},
    {"quantizations": ["int4"], "ignore": ["together", "deepinfra", "parasail"]},
    {"max_price": {"completion": 1}},
    {"order": ["nobody"], "allow_fallbacks": False},
])
def test_nothing_left_is_404_constraint_filtered(srv, prefs):
    r = post(srv, body(provider=prefs))
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == 404 and err["message"].startswith("No endpoints found matching")
    assert err["availability"]["code"] == "constraint_filtered"
    assert err["availability"]["retryable"] is False
    assert "metadata" in err


def test_default_routing_is_deterministic_and_load_balanced(srv):
    first = [post(srv, body(f"prompt {i}", max_tokens=50)).json()["provider"] for i in range(40)]
    again = [post(srv, body(f"prompt {i}", max_tokens=50)).json()["provider"] for i in range(40)]
    assert first == again
    assert len(set(first)) >= 3


# -- answers -----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, model, has_reasoning", [
    ({}, MODEL, True),                                     # kimi-k2.5 reasons by default
    ({"reasoning": {"enabled": False}}, MODEL, False),
    ({"reasoning": {"effort": "none"}}, MODEL, False),
    ({"reasoning": {"effort": "high"}}, "moonshotai/kimi-k2-0905", True),
    ({"include_reasoning": True}, "moonshotai/kimi-k2-0905", True),
    ({}, "moonshotai/kimi-k2-0905", False),
])
def test_reasoning_switches(srv, extra, model, has_reasoning):
    req = {**body("reasoning switch"), **extra, "model": model, "max_tokens": 1000}
    msg = post(srv, req).json()["choices"][0]["message"]
    assert (msg["reasoning"] is not None) is has_reasoning
    assert ("reasoning_details" in msg) is has_reasoning
    assert msg["content"] == answer_for_request(req).content


def test_reasoning_exclude_bills_the_reasoning_but_hides_it(srv):
    req = body("hidden thoughts", reasoning={"enabled": True, "exclude": True}, max_tokens=1000)
    out = post(srv, req).json()
    assert out["choices"][0]["message"]["reasoning"] is None
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


@pytest.mark.parametrize("max_tokens", [1, 10, 60, 130])
def test_max_tokens_cuts_reasoning_then_content(srv, max_tokens):
    req = body("a long question that will be cut", max_tokens=max_tokens)
    full = answer_for_request(body("a long question that will be cut"))
    assert full.completion_tokens > 130            # so every case here is cut
    out = post(srv, req).json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == max_tokens
    msg = choice["message"]
    if max_tokens <= full.reasoning_tokens:
        assert msg["content"] == "" and full.reasoning.startswith(msg["reasoning"])
    else:
        assert msg["reasoning"] == full.reasoning and full.content.startswith(msg["content"])


def test_answers_are_deterministic_varied_and_exotic():
    lengths, specials, non_ascii = set(), 0, 0
    for i in range(200):
        a = expected_answer([{"role": "user", "content": f"q{i}"}], model=MODEL, seed=None,
                            reasoning=True, max_tokens=None)
        assert a == expected_answer([{"role": "user", "content": f"q{i}"}], model=MODEL,
                                    seed=None, reasoning=True, max_tokens=None)
        assert "".join(a.content_pieces) == a.content and len(a.content_pieces) == len(
            a.content.split())
        assert hashlib.sha256(f"q{i}".encode()).hexdigest()[:12] in a.content
        lengths.add(len(a.content_pieces))
        specials += any(s in a.content + a.reasoning for s in ("<|im_end|>", "<think>"))
        non_ascii += not (a.content + a.reasoning).isascii()
    assert min(lengths) >= 20 and max(lengths) <= 120 and len(lengths) > 50
    assert 10 < specials < 150 and non_ascii > 150
    one = expected_answer([{"role": "user", "content": "q"}], model=MODEL, seed=1,
                          reasoning=False, max_tokens=None)
    two = expected_answer([{"role": "user", "content": "q"}], model=MODEL, seed=2,
                          reasoning=False, max_tokens=None)
    assert one.content != two.content and one.reasoning is None


def test_prompt_tokens_count_every_message(srv):
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "two words"}]}]
    out = post(srv, {"model": MODEL, "messages": msgs, "max_tokens": 500}).json()
    assert out["usage"]["prompt_tokens"] == (2 + 4) + (2 + 4)


# -- money -------------------------------------------------------------------------------

def test_402_when_the_balance_cannot_cover_max_tokens(srv):
    srv.configure(balance=srv.stats()["total_usage"] + 0.01)
    prefs = {"only": ["together"]}           # $0.0000028 per completion token
    r = post(srv, body("money", max_tokens=16000, provider=prefs))
    assert r.status_code == 402
    err = r.json()["error"]
    prompt_cost = answer_for_request(body("money")).prompt_tokens * 0.0000005
    affordable = int((0.01 - prompt_cost) / 0.0000028)
    assert err["code"] == 402
    assert err["message"].startswith(
        "This request requires more credits, or fewer max_tokens. You requested up to 16000 "
        f"tokens, but can only afford {affordable}.")
    r = post(srv, body("money", provider=prefs))         # no max_tokens: the model's maximum
    assert r.status_code == 402 and "up to 262144 tokens" in r.json()["error"]["message"]
    r = post(srv, body("money", max_tokens=affordable - 5, provider=prefs))
    assert r.status_code == 200


def test_key_limit_caps_spending_and_shows_in_key(srv):
    used = srv.stats()["total_usage"]
    srv.configure(key_limit=used + 0.02)
    data = get(srv, "/key").json()["data"]
    assert data["limit"] == pytest.approx(used + 0.02)
    assert data["limit_remaining"] == pytest.approx(0.02)
    assert data["usage"] == pytest.approx(used)
    r = post(srv, body("limited", max_tokens=20000, provider={"only": ["together"]}))
    assert r.status_code == 402 and "settings/keys" in r.json()["error"]["message"]
    srv.configure(key_limit=None)
    assert get(srv, "/key").json()["data"]["limit"] is None
    assert get(srv, "/key").json()["data"]["limit_remaining"] is None


def test_price_scale_multiplies_the_bill(srv):
    req = body("scaled", max_tokens=300, provider={"only": ["parasail"]})
    base = post(srv, req).json()["usage"]["cost"]
    srv.configure(price_scale=1000)
    assert post(srv, req).json()["usage"]["cost"] == pytest.approx(base * 1000)


def test_charges_accumulate_in_credits_key_stats_and_ledger(srv):
    before = srv.stats()
    n_ledger = len(srv.ledger())
    costs = []
    for i in range(5):
        out = post(srv, body(f"bill {i}", max_tokens=400)).json()
        costs.append(out["usage"]["cost"])
        gen = get(srv, "/generation", id=out["id"]).json()["data"]
        assert gen["id"] == out["id"] and gen["total_cost"] == out["usage"]["cost"]
        assert gen["provider_name"] == out["provider"]
        assert gen["native_tokens_completion"] == out["usage"]["completion_tokens"]
        assert gen["native_tokens_reasoning"] == \
            out["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert gen["finish_reason"] == out["choices"][0]["finish_reason"]
    after = srv.stats()
    assert after["charged"] == before["charged"] + 5
    assert after["total_usage"] == pytest.approx(before["total_usage"] + sum(costs))
    credits = get(srv, "/credits").json()["data"]
    assert credits["total_usage"] == pytest.approx(after["total_usage"])
    assert credits["total_credits"] == 100.0
    lines = srv.ledger()[n_ledger:]
    assert [ln["cost"] for ln in lines] == pytest.approx(costs)
    assert [ln["request_user_text_sha256"] for ln in lines] == [
        user_text_sha256([{"role": "user", "content": f"bill {i}"}]) for i in range(5)]


def test_unknown_generation_is_404(srv):
    r = get(srv, "/generation", id="gen-0-nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    assert get(srv, "/generation").status_code == 400


@pytest.mark.parametrize("mode, status, data", [
    ("normal", 200, None), ("forbidden", 403, None),
    ("zeros", 200, {"total_credits": 0, "total_usage": 0})])
def test_credits_modes(srv, mode, status, data):
    srv.configure(credits_mode=mode)
    r = get(srv, "/credits")
    assert r.status_code == status
    if mode == "normal":
        assert r.json()["data"]["total_credits"] == 100.0
    elif mode == "forbidden":
        assert r.json()["error"]["code"] == 403
    else:
        assert r.json()["data"] == data


def test_model_endpoints_table(srv):
    r = httpx.get(srv.base_url + "/models/moonshotai/kimi-k2.5/endpoints")
    assert r.status_code == 200
    eps = r.json()["data"]["endpoints"]
    assert {(e["tag"], e["quantization"]) for e in eps} == {
        ("moonshotai", "unknown"), ("together", "int4"), ("deepinfra", "int4"),
        ("deepinfra/turbo", "fp4"), ("fireworks", "nvfp4"), ("baseten", "fp4"),
        ("parasail", "int4")}
    price = {e["tag"]: float(e["pricing"]["prompt"]) + float(e["pricing"]["completion"])
             for e in eps}
    requantized = {"deepinfra/turbo", "fireworks", "baseten"}
    assert max(price[t] for t in requantized) < min(p for t, p in price.items()
                                                    if t not in requantized)
    assert all(isinstance(e["pricing"]["prompt"], str) for e in eps)
    assert httpx.get(srv.base_url + "/models/nobody/nothing/endpoints").status_code == 404


def test_config_endpoint_rejects_bad_settings(srv):
    for bad in ({"faults": {"teapot": 1}}, {"faults": {"429": 2}}, {"api_key": "x"},
                {"faults": {"429": 0.7, "cut": 0.7}},
                {"credits_mode": "weird"}, {"latency": -1}):
        r = httpx.post(srv.url + "/_standin/config", json=bad)
        assert r.status_code == 400, bad


# -- faults ------------------------------------------------------------------------------

STATUS_FAULTS = ["429", "500", "502", "503", "524", "529"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", STATUS_FAULTS)
def test_status_faults(srv, kind, stream):
    srv.configure(faults={kind: 1.0}, retry_after=2.5)
    before = srv.stats()
    r = post(srv, body(f"status fault {kind}", max_tokens=100, stream=stream))
    assert r.status_code == int(kind)
    err = r.json()["error"]
    assert err["code"] == int(kind) and err["message"] and err["metadata"]["provider_name"]
    if kind == "429":
        assert r.headers["Retry-After"] == "2.5"
        assert err["message"] == "Rate limit exceeded"
        avail = err["availability"]
        assert (avail["code"], avail["retryable"], avail["retry_after"]) == (
            "capacity_exhausted", True, 2.5)
        assert avail["requested_models"] == [MODEL] and avail["affected_providers"]
    after = srv.stats()
    assert after["charged"] == before["charged"]                 # faults never charge
    assert after["faults"][kind] == before["faults"].get(kind, 0) + 1
    assert after["statuses"][kind] == before["statuses"].get(kind, 0) + 1


def test_error200_plain_and_streamed(srv):
    srv.configure(faults={"error200": 1.0})
    charged = srv.stats()["charged"]
    r = post(srv, body("e200", max_tokens=100))
    assert r.status_code == 200
    out = r.json()
    assert "choices" not in out and out["error"]["code"] >= 400 and out["id"].startswith("gen-")
    status, lines = stream_lines(srv, body("e200", max_tokens=100))
    assert status == 200 and "data: [DONE]" not in lines
    [chunk] = chunks_of(lines)
    assert chunk["error"]["metadata"]["error_type"] and "choices" not in chunk
    assert srv.stats()["charged"] == charged


def test_empty_choices_plain_and_streamed(srv):
    srv.configure(faults={"empty": 1.0})
    charged = srv.stats()["charged"]
    out = post(srv, body("empty", max_tokens=100)).json()
    assert out["choices"] == [] and "error" not in out and "usage" not in out
    status, lines = stream_lines(srv, body("empty", max_tokens=100))
    assert status == 200 and lines[-1] == "data: [DONE]"
    chunks = chunks_of(lines)
    assert all(c["choices"] == [] and "usage" not in c and "error" not in c for c in chunks)
    assert srv.stats()["charged"] == charged


def test_midstream_error(srv):
    srv.configure(faults={"midstream": 1.0})
    charged = srv.stats()["charged"]
    req = body("midstream", max_tokens=1000)
    status, lines = stream_lines(srv, req)
    assert status == 200 and "data: [DONE]" not in lines
    chunks = chunks_of(lines)
    *good, last = chunks
    assert good and all("error" not in c for c in good)
    want = answer_for_request(req)
    assert (want.reasoning + want.content).startswith(joined(good, "reasoning")
                                                      + joined(good, "content"))
    assert last["error"]["code"] == 502
    assert last["error"]["metadata"]["error_type"] == "provider_unavailable"
    assert last["choices"][0]["finish_reason"] == "error"
    out = post(srv, req).json()                  # non-streaming: like error200
    assert "choices" not in out and out["error"]
    assert srv.stats()["charged"] == charged


def test_cut_connection_plain_and_streamed(srv):
    srv.configure(faults={"cut": 1.0})
    charged = srv.stats()["charged"]
    with pytest.raises(httpx.RemoteProtocolError):
        post(srv, body("cut", max_tokens=1000))
    got = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", srv.base_url + "/chat/completions",
                          json=body("cut", max_tokens=1000, stream=True),
                          headers={"Authorization": f"Bearer {srv.api_key}"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                got.append(line)
    assert any(line.startswith("data: {") for line in got)
    assert "data: [DONE]" not in got
    assert srv.stats()["charged"] == charged


@pytest.mark.parametrize("stream", [False, True])
def test_hang_sends_headers_then_nothing(srv, stream):
    srv.configure(faults={"hang": 1.0}, latency=0.2)       # keep-alives would come every 0.05s
    headers = {"Authorization": f"Bearer {srv.api_key}"}
    timeout = httpx.Timeout(5.0, read=0.6)
    with httpx.stream("POST", srv.base_url + "/chat/completions", headers=headers,
                      json=body("hang", max_tokens=100, stream=stream), timeout=timeout) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            for _ in r.iter_raw():
                pytest.fail("a hang must send no bytes")


def test_heartbeat_sends_only_comments(srv):
    srv.configure(faults={"heartbeat": 1.0})
    headers = {"Authorization": f"Bearer {srv.api_key}"}
    seen = []
    with httpx.stream("POST", srv.base_url + "/chat/completions", headers=headers,
                      json=body("beat", max_tokens=100, stream=True), timeout=10) as r:
        for line in r.iter_lines():
            if line:
                seen.append(line)
            if len(seen) == 6:
                break
    assert seen == [": OPENROUTER PROCESSING"] * 6


def test_in_flight_counts_open_requests_and_disconnects_end_them(srv):
    """Hung requests stay in flight; a client that goes away ends its handler."""
    import socket

    srv.configure(faults={"hang": 1.0})
    base = srv.stats()["in_flight"]
    ok = srv.stats()["statuses"].get("200", 0)
    payload = json.dumps(body("hold", max_tokens=10)).encode()
    request = (f"POST /api/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {srv.api_key}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    socks = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(request)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")       # headers, then nothing
        socks.append(s)
    assert srv.stats()["in_flight"] == base + 3
    assert srv.stats()["max_in_flight"] >= 3
    for s in socks:
        s.close()
    wait_for(lambda: srv.stats()["in_flight"] == base)
    assert srv.stats()["statuses"]["200"] == ok + 3           # headers were sent: 200


@pytest.mark.parametrize("bill", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_is_billed_only_with_bill_cancelled(srv, bill, stream):
    import socket

    srv.configure(latency=30.0, bill_cancelled=bill)
    before = srv.stats()
    payload = json.dumps(body("leaving early", max_tokens=100, stream=stream)).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall((f"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {srv.api_key}\r\nContent-Length: {len(payload)}"
                   "\r\n\r\n").encode() + payload)
        wait_for(lambda: srv.stats()["completions_started"] == before["completions_started"] + 1)
    wait_for(lambda: srv.stats()["in_flight"] == before["in_flight"])
    srv.configure(bill_cancelled=False)
    after = srv.stats()
    assert after["charged"] == before["charged"] + bill
    assert after["abandoned"] == before["abandoned"] + 1  # billed or not, it was abandoned


def test_misroute_serves_from_an_excluded_provider_and_bills(srv):
    srv.configure(faults={"misroute": 1.0})
    # (every DeepInfra endpoint excluded: the answer's provider name tells them all apart
    # from the allowed ones, whichever excluded endpoint the seeded draw picks)
    prefs = {"ignore": ["fireworks", "baseten", "deepinfra"]}
    before = srv.stats()
    out = post(srv, body("misroute", max_tokens=100, provider=prefs)).json()
    assert out["provider"] in {"Fireworks", "BaseTen", "DeepInfra"}
    assert out["choices"][0]["message"]["content"]
    after = srv.stats()
    assert after["faults"]["misroute"] == before["faults"].get("misroute", 0) + 1
    assert after["charged"] == before["charged"] + 1        # a served generation is billed
    # nothing excluded: nothing to misroute to, so it is served normally and not counted
    post(srv, body("misroute", max_tokens=100))
    assert srv.stats()["faults"]["misroute"] == after["faults"]["misroute"]


def test_fault_rates_follow_the_seeded_draw(standin):
    faults = {"429": 0.2, "502": 0.1, "empty": 0.1}
    counts = []
    for _ in range(2):
        server = standin(faults=faults, seed=3)
        statuses = [post(server, body(f"rate {i}", max_tokens=50)).status_code
                    for i in range(200)]
        stats = server.stats()
        counts.append(stats["faults"])
        assert statuses.count(429) == stats["faults"]["429"]
        assert statuses.count(502) == stats["faults"]["502"]
        assert stats["charged"] == 200 - sum(stats["faults"].values())
        server.stop()
    assert counts[0] == counts[1]                               # same seed, same draws
    assert 20 <= counts[0]["429"] <= 60 and 5 <= counts[0]["502"] <= 35


def test_latency_and_live_reconfiguration(srv):
    srv.configure(faults={"429": 1.0})
    assert post(srv, body("live", max_tokens=50)).status_code == 429
    # a latency far longer than the test: keep-alive comments repeat while the model
    # "thinks", read until the third one has come (counted as they arrive, not within a
    # time; the interval is 0.05 s), then the client goes away
    srv.configure(faults={}, latency=600)
    headers = {"Authorization": f"Bearer {srv.api_key}"}
    seen = []
    with httpx.stream("POST", srv.base_url + "/chat/completions", headers=headers,
                      json=body("live", max_tokens=50, stream=True), timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                seen.append(line)
            if len(seen) == 3:
                break
    assert seen == [": OPENROUTER PROCESSING"] * 3  # no data before the latency is over
    srv.configure(latency=0.0)  # then the answer itself, once the latency is gone
    status, lines = stream_lines(srv, body("live", max_tokens=50))
    assert status == 200 and lines[-1] == "data: [DONE]" and chunks_of(lines)


# -- conversations: history-dependent answers, session_id (docs/conversations.md) ---------

def test_a_later_turns_answer_depends_on_its_whole_history(srv):
    from kimipipe.standin.answers import history_sha256

    first = [{"role": "user", "content": "Opening question"}]
    answer = post(srv, body(messages=first)).json()["choices"][0]["message"]
    history = [*first, {"role": "assistant", "content": answer["content"]},
               {"role": "user", "content": "And then?"}]
    got = post(srv, body(messages=history)).json()["choices"][0]["message"]["content"]
    assert f"[h:{history_sha256(history)[:12]}]" in got
    assert got == answer_for_request(body(messages=history)).content
    # another earlier answer, or earlier reasoning sent back: another answer
    other = [history[0], {**history[1], "content": "a source's own answer"}, history[2]]
    with_reasoning = [history[0], {**history[1], "reasoning": answer["reasoning"]}, history[2]]
    answers = {post(srv, body(messages=m)).json()["choices"][0]["message"]["content"]
               for m in (history, other, with_reasoning)}
    assert len(answers) == 3
    # a single turn's answer is the one it always was: the last user message's alone
    assert answer["content"] == expected_answer(first, model=MODEL, seed=None, reasoning=True,
                                                max_tokens=None).content


def test_session_id_keeps_a_conversation_on_one_provider_and_its_prefix_cached(srv):
    turns = [{"role": "user", "content": f"turn {k}"} for k in range(4)]
    providers, cached, prompt = [], [], []
    messages = []
    for user in turns:
        messages = [*messages, user]
        r = post(srv, body(messages=messages, session_id="conv-7"))
        data = r.json()
        providers.append(data["provider"])
        cached.append(data["usage"]["prompt_tokens_details"]["cached_tokens"])
        prompt.append(data["usage"]["prompt_tokens"])
        messages = [*messages, {"role": "assistant", "content": data["choices"][0]["message"]["content"]}]
    assert len(set(providers)) == 1  # sticky routing
    # each turn's prefix (every message before its new user turn) was the last request's
    assert cached[0] == 0 and all(cached[k] == prompt[k - 1] for k in range(1, 4))
    # billed at 0.25x for the cached part: cheaper than the same request without a session
    again = post(srv, body(messages=messages[:-1], session_id="conv-7")).json()
    alone = post(srv, body(messages=messages[:-1])).json()
    assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    if again["provider"] == alone["provider"]:
        assert again["usage"]["cost"] < alone["usage"]["cost"]
    # many sessions spread over the providers, each one staying on its own
    spread = {post(srv, body(text="x", session_id=f"s{i}")).json()["provider"] for i in range(40)}
    assert len(spread) > 1
    r = post(srv, body(session_id="x" * 257))
    assert r.status_code == 400 and "session_id" in r.json()["error"]["message"]
