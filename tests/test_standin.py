"""The OpenRouter stand-in through real sockets: every endpoint, fault, routing rule, bill."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys

import httpx
import pytest

from kimipipe.standin.answers import answer_for_request
from kimipipe.standin.providers import KIMI_K25
from kimipipe.standin.testing import StandIn

MODEL = "moonshotai/kimi-k2.5"


def body(text="What is 2+2?", **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def post(server, payload, key=None, raw=None, timeout=30.0):
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    if raw is not None:
        return httpx.post(server.base_url + "/chat/completions", content=raw, headers=headers,
                          timeout=timeout)
    return httpx.post(server.base_url + "/chat/completions", json=payload, headers=headers,
                      timeout=timeout)


def get(server, path, key=None, **params):
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    return httpx.get(server.base_url + path, headers=headers, params=params, timeout=30)


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


def test_server_cli_port_file_and_clean_sigterm(tmp_path):
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not list(tmp_path.glob("port.tmp*"))


def test_cli_rejects_bad_fault():
    proc = subprocess.run([sys.executable, "-m", "kimipipe.standin", "--fault", "teapot=0.5"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown fault kind 'teapot'" in proc.stderr


def test_standin_class_as_context_manager():
    with StandIn(balance=3) as server:
        assert get(server, "/credits").json()["data"]["total_credits"] == 3.0
        pid = server.pid
    assert server.proc is None and pid
