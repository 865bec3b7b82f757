"""The stand-in's credit limits over real sockets: the in-flight budget, one request larger
than it, the balance gone, the key limit, workspace and guardrail budgets, moderation."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime

import httpx
import pytest
from helpers import MODEL, body, get, post, wait_for

from kimipipe.standin.answers import count_prompt_tokens
from kimipipe.standin.providers import KIMI_K25

TOGETHER = next(e for e in KIMI_K25 if e.tag == "together")
IN_FLIGHT = {"error": {"code": 402, "message": (
    "This request would exceed your available credits given your current in-flight requests. "
    "Retry after in-flight requests settle, or add credits."), "metadata": {
    "reason": "in_flight_budget_exhausted", "limit_source": "openrouter_in_flight_budget"}}}
BALANCE_GONE = {"error": {"code": 402, "message": (
    "Insufficient credits. Add more using https://openrouter.ai/settings/credits"),
    "metadata": {"limit_source": "openrouter_credits"}}}


def worst_case(payload, endpoint=TOGETHER):
    return (count_prompt_tokens(payload["messages"]) * endpoint.prompt
            + payload["max_tokens"] * endpoint.completion)


def hold(server, payload):
    """Open a streamed completion on a raw socket and read its headers: the request is
    admitted (and reserved) and stays running (the server is "thinking") until closed."""
    data = json.dumps({**payload, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    s.sendall((f"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {server.api_key}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return s


# -- the in-flight spending budget -----------------------------------------------------

def test_in_flight_budget_refuses_past_ratio_times_balance(standin):
    # cap 0.5 x $1; each big request reserves ~$0.14 (50,000 tokens at $2.8/M)
    server = standin(balance=1.0, inflight_ratio=0.5, settle=600, latency=600,
                     keepalive_interval=0.5)
    big = body("hold", max_tokens=50_000, provider={"only": ["together"]})
    small = body("small", max_tokens=10_000, provider={"only": ["together"]})
    held = [hold(server, big) for _ in range(3)]
    stats = server.stats()
    assert stats["inflight_running"] == 3
    assert stats["inflight_reserved"] == pytest.approx(3 * worst_case(big))
    assert stats["inflight_cap"] == pytest.approx(0.5)
    r = post(server, big)                               # 4 x 0.14 > 0.5
    assert r.status_code == 402 and r.json() == IN_FLIGHT
    assert r.headers["Retry-After"] == "600"            # nothing settling yet: the settle time
    assert 3 * worst_case(big) + worst_case(small) < 0.5
    held.append(hold(server, small))                    # what is left still takes a small one
    # adding credits raises the budget
    server.configure(balance=2.0)
    assert server.stats()["inflight_cap"] == pytest.approx(1.0)
    held.append(hold(server, big))
    server.configure(balance=1.0, latency=0)
    for s in held:
        s.close()
    wait_for(lambda: server.stats()["inflight_running"] == 0)
    stats = server.stats()
    assert stats["inflight_settling"] == 5              # finished, still counted for 600 s
    assert stats["inflight_reserved"] == pytest.approx(4 * worst_case(big) + worst_case(small))
    assert stats["inflight_peak_reserved"] == pytest.approx(stats["inflight_reserved"])
    r = post(server, small)
    assert r.status_code == 402 and r.json() == IN_FLIGHT
    assert 1 <= int(r.headers["Retry-After"]) <= 600    # until the oldest reservation expires
    assert server.stats()["refusals"] == {"402": {"in_flight_budget_exhausted": 2}, "403": {}}
    assert server.stats()["charged"] == 0               # refusals and cancelled holds: free


def test_settled_reservations_expire_and_the_budget_frees(standin):
    server = standin(balance=1.0, inflight_ratio=0.5, settle=0.5, ledger=True)
    req = body("settles", max_tokens=150_000, provider={"only": ["together"]})
    assert 0.25 < worst_case(req) <= 0.5                # one at a time fits
    assert post(server, req).status_code == 200
    wait_for(lambda: server.stats()["inflight_reserved"] == 0)
    assert server.stats()["inflight_settling"] == 0
    assert post(server, req).status_code == 200         # the settled one no longer counts
    assert len(server.ledger()) == 2


def test_in_flight_budget_off_by_default(standin):
    server = standin(balance=1.0, latency=60, keepalive_interval=0.5)
    big = body("hold", max_tokens=50_000, provider={"only": ["together"]})
    held = [hold(server, big) for _ in range(8)]        # 8 x 0.14 > $1: no in-flight cap
    stats = server.stats()
    assert stats["inflight_cap"] is None and stats["inflight_reserved"] == 0
    assert stats["in_flight"] == 8
    for s in held:
        s.close()


@pytest.mark.parametrize("ratio", [None, 0.5])
def test_one_request_larger_than_the_budget_is_weight_exceeds_budget(standin, ratio):
    server = standin(balance=0.6, inflight_ratio=ratio)
    req = body("too big", max_tokens=400_000, provider={"only": ["together"]})
    r = post(server, req)
    assert r.status_code == 402
    budget = 0.6 if ratio is None else 0.3          # the balance, or the in-flight budget
    prompt_cost = count_prompt_tokens(req["messages"]) * TOGETHER.prompt
    affordable = int((budget - prompt_cost) / TOGETHER.completion)
    assert r.json() == {"error": {"code": 402, "message": (
        "This request requires more credits, or fewer max_tokens. You requested up to 400000 "
        f"tokens, but can only afford {affordable}."), "metadata": {
        "reason": "weight_exceeds_budget", "limit_source": "openrouter_credits"}}}
    assert "Retry-After" not in r.headers                   # waiting will not help
    # without max_tokens the worst case is the endpoint's maximum completion
    r = post(server, body("too big", provider={"only": ["together"]}))
    assert r.status_code == 402 and "up to 262144 tokens" in r.json()["error"]["message"]
    assert post(server, {**req, "max_tokens": affordable - 1}).status_code == 200
    assert server.stats()["refusals"]["402"] == {"weight_exceeds_budget": 2}


def test_balance_gone_is_402_openrouter_credits(standin):
    server = standin(balance=0.5, ledger=True)
    assert post(server, body("spend", max_tokens=300)).status_code == 200
    server.configure(balance=server.stats()["total_usage"])     # nothing left
    for stream in (False, True):
        r = post(server, body("broke", max_tokens=10, stream=stream))
        assert r.status_code == 402 and r.json() == BALANCE_GONE
    assert server.stats()["refusals"]["402"] == {"openrouter_credits": 2}
    assert len(server.ledger()) == 1
    server.configure(balance=1.0)                                # a top-up resumes
    assert post(server, body("again", max_tokens=10)).status_code == 200


# -- the key limit, workspace and guardrail budgets ------------------------------------

def budget_body(status, source, scope, limit, spend, resets_at=None):
    return {"error": {"code": status, "message": "Budget limit exceeded", "metadata": {
        "limit_source": source, "scope": scope, "limit_usd": pytest.approx(limit),
        "spend_usd": pytest.approx(spend), "resets_at": resets_at}}}


def test_key_limit_spent_is_402_by_default_then_the_403_form_and_raising_it_resumes(standin):
    server = standin(key_limit=5.0, ledger=True, limit_status=403)
    assert post(server, body("first", max_tokens=300)).status_code == 200
    used = server.stats()["total_usage"]
    server.configure(key_limit=used)                     # the limit is reached mid-run
    r = post(server, body("refused", max_tokens=300))
    assert r.status_code == 403
    assert r.json() == budget_body(403, "openrouter_key_limit", "key_limit", used, used)
    assert "Retry-After" not in r.headers
    key = get(server, "/key").json()["data"]
    assert key["limit"] == pytest.approx(used) and key["limit_remaining"] == pytest.approx(0)
    [entry] = key["budgets"]
    assert entry["scope"] == "key_limit" and entry["remaining_usd"] == pytest.approx(0)
    assert key["effective_budget"] == entry
    server.configure(limit_status=402)                   # the documented 402 form, same body
    r = post(server, body("refused", max_tokens=300, stream=True))
    assert r.status_code == 402
    assert r.json() == budget_body(402, "openrouter_key_limit", "key_limit", used, used)
    server.configure(key_limit=used + 1.0)               # raising the limit resumes
    assert post(server, body("resumed", max_tokens=300)).status_code == 200
    assert len(server.ledger()) == 2
    assert server.stats()["refusals"] == {"403": {"openrouter_key_limit": 1},
                                          "402": {"openrouter_key_limit": 1}}


def test_key_limit_remaining_below_one_worst_case_is_402_with_the_key_metadata(standin):
    server = standin(key_limit=0.001, limit_reset="monthly")
    req = body("key binds", max_tokens=1000, provider={"only": ["together"]})
    r = post(server, req)
    assert r.status_code == 402
    prompt_cost = count_prompt_tokens(req["messages"]) * TOGETHER.prompt
    affordable = int((0.001 - prompt_cost) / TOGETHER.completion)
    err = r.json()["error"]
    assert err["message"] == (
        "This request requires more credits, or fewer max_tokens. You requested up to 1000 "
        f"tokens, but can only afford {affordable}. To increase, visit "
        "https://openrouter.ai/settings/keys and create a key with a higher total limit")
    meta = err["metadata"]
    assert meta["limit_source"] == "openrouter_key_limit" and meta["scope"] == "key_limit"
    assert meta["limit_usd"] == 0.001 and meta["spend_usd"] == 0
    resets = datetime.fromisoformat(meta["resets_at"].replace("Z", "+00:00"))
    assert resets.day == 1 and resets > datetime.now(UTC)
    assert get(server, "/key").json()["data"]["limit_reset"] == "monthly"


def test_guardrail_then_workspace_then_key_in_openrouters_order(standin):
    server = standin(key_limit=10, workspace_budget=10, guardrail_budget=10,
                     limit_reset="weekly")
    assert post(server, body("spend", max_tokens=300)).status_code == 200
    used = server.stats()["total_usage"]
    key = get(server, "/key").json()["data"]
    assert [b["scope"] for b in key["budgets"]] == ["api_key", "workspace", "key_limit"]
    assert all(b["spend_usd"] == pytest.approx(used) for b in key["budgets"])
    assert key["budgets"][1]["budget_id"] and key["budgets"][0]["guardrail_id"]
    server.configure(key_limit=used, workspace_budget=used, guardrail_budget=used)
    expected = [("openrouter_guardrail_budget", "api_key", "guardrail_budget"),
                ("openrouter_workspace_budget", "workspace", "workspace_budget"),
                ("openrouter_key_limit", "key_limit", "key_limit")]
    for source, scope, setting in expected:
        assert get(server, "/key").json()["data"]["effective_budget"]["scope"] == scope
        r = post(server, body("refused", max_tokens=300))
        assert r.status_code == 402  # the documented form (--limit-status 403: the other seen)
        err = r.json()["error"]
        assert err["message"] == "Budget limit exceeded"
        assert (err["metadata"]["limit_source"], err["metadata"]["scope"]) == (source, scope)
        resets = datetime.fromisoformat(err["metadata"]["resets_at"].replace("Z", "+00:00"))
        assert resets.weekday() == 0 and resets > datetime.now(UTC)
        server.configure(**{setting: used + 1})
    assert post(server, body("all raised", max_tokens=300)).status_code == 200
    assert server.stats()["refusals"]["402"] == {s: 1 for s, _, _ in expected}


# -- moderation -------------------------------------------------------------------------

def test_moderation_marker_is_403_without_limit_source_and_never_charged(standin):
    server = standin(moderation_marker="FORBIDDEN", inflight_ratio=1.0, settle=3600,
                     ledger=True)
    text = "x " * 200 + "something FORBIDDEN here" + " y" * 200
    for stream in (False, True):
        r = post(server, body(text, max_tokens=100, stream=stream,
                              provider={"only": ["parasail"]}))
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["code"] == 403 and "limit_source" not in err["metadata"]
        assert err["message"] == (f"{MODEL} requires moderation on Parasail. Your input was "
                                  "flagged for \"violence\"")
        assert err["metadata"]["reasons"] == ["violence"]
        assert "FORBIDDEN" in err["metadata"]["flagged_input"]
        assert len(err["metadata"]["flagged_input"]) <= 100
        assert err["metadata"]["provider_name"] == "Parasail"
        assert err["metadata"]["model_slug"] == MODEL
    assert post(server, body("a harmless prompt", max_tokens=100)).status_code == 200
    stats = server.stats()
    assert stats["refusals"]["403"] == {"moderation": 2}
    assert stats["charged"] == 1 and len(server.ledger()) == 1
    assert stats["inflight_settling"] == 1               # only the answered one settles


def test_moderation_fault_rate(standin):
    server = standin(faults={"moderation": 0.5}, seed=2, inflight_ratio=1.0, settle=3600)
    codes = [post(server, body(f"prompt {i}", max_tokens=50)).status_code for i in range(60)]
    stats = server.stats()
    assert codes.count(403) == stats["faults"]["moderation"] == stats["refusals"]["403"][
        "moderation"]
    assert 15 <= codes.count(403) <= 45 and codes.count(200) == 60 - codes.count(403)
    assert stats["charged"] == codes.count(200)
    assert stats["inflight_settling"] == codes.count(200)  # refused ones reserved nothing


# -- options ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--inflight-ratio", "0"], "inflight_ratio must be > 0"),
    (["--settle", "-1"], "settle must be >= 0"),
    (["--limit-status", "401"], "is not one of"),
    (["--limit-reset", "hourly"], "is not one of"),
    (["--workspace-budget", "-2"], "workspace_budget must be >= 0"),
    (["--drop-reasoning", "nobody=0.5"], "unknown provider 'nobody'"),
    (["--drop-reasoning", "together=2"], "rate must be in [0, 1]"),
    (["--drop-reasoning", "together"], "expected PROVIDER=RATE"),
    (["--inline-reasoning", "nobody"], "unknown provider 'nobody'"),
    (["--ignore-sampling", "nobody"], "unknown provider 'nobody'"),
    (["--moderation-marker", ""], "moderation_marker must not be empty"),
])
def test_cli_rejects_bad_limit_and_quirk_options(args, message):
    proc = subprocess.run([sys.executable, "-m", "kimipipe.standin", *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr


def test_live_config_of_limits_and_quirks(standin):
    server = standin()
    for bad in ({"limit_status": 401}, {"inflight_ratio": -1}, {"drop_reasoning": {"nobody": 1}},
                {"ignore_sampling": "together"}, {"limit_reset": "hourly"}):
        r = httpx.post(server.url + "/_standin/config", json=bad)
        assert r.status_code == 400, bad
    now = server.configure(inflight_ratio=0.8, settle=3, drop_reasoning={"together": 0.2},
                           inline_reasoning=["parasail"], ignore_sampling=["deepinfra"],
                           not_distillable=True, moderation_marker="NOPE",
                           workspace_budget=4, guardrail_budget=None)
    assert (now["inflight_ratio"], now["settle"], now["drop_reasoning"], now["inline_reasoning"],
            now["ignore_sampling"], now["not_distillable"], now["moderation_marker"],
            now["workspace_budget"], now["guardrail_budget"]) == (
        0.8, 3.0, {"together": 0.2}, ["parasail"], ["deepinfra"], True, "NOPE", 4.0, None)
    assert "api_key" not in now
    assert server.configure(inflight_ratio=None)["inflight_ratio"] is None
