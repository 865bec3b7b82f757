"""kp-credits against the stand-in: each source, the --min threshold, each error; no key leaks."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from conftest import kp
from helpers import MODEL

from kimipipe.openrouter.account import (
    Account,
    AccountError,
    AuthError,
    NetworkError,
    balance_from,
    fetch_balance,
)

KEY = "sk-or-v1-0123456789abcdef-secret"


def spend(server, n=3):
    import httpx

    with httpx.Client(timeout=30) as c:
        for i in range(n):
            r = c.post(server.base_url + "/chat/completions",
                       headers={"Authorization": f"Bearer {server.api_key}"},
                       json={"model": MODEL, "max_tokens": 500,
                             "messages": [{"role": "user", "content": f"spend {i}"}]})
            assert r.status_code == 200
    return server.stats()["total_usage"]


def run(server, *args, key=KEY, **kw):
    env = {"OPENROUTER_BASE_URL": server.base_url, "OPENROUTER_API_KEY": key}
    result = kp("credits", *args, env=env, **kw)
    assert KEY not in result.stdout.decode() and KEY not in result.stderr
    return result


def test_credits_source(standin):
    server = standin(api_key=KEY, balance=12.5)
    used = spend(server)
    r = run(server, "--json")
    assert r.code == 0 and r.stderr == ""
    [rec] = r.records()
    assert rec == {"total_credits": 12.5, "total_usage": pytest.approx(used),
                   "remaining": pytest.approx(12.5 - used), "key_limit": None,
                   "key_limit_remaining": None, "source": "credits"}


def test_not_a_terminal_means_json_and_text_forces_text(standin):
    server = standin(api_key=KEY, balance=7, key_limit=3)
    assert run(server).records()[0]["source"] == "credits"      # stdout is a pipe here
    r = run(server, "--text")
    assert r.code == 0
    assert r.stdout.decode() == (
        "OpenRouter balance (from /credits)\n"
        "  total credits  $7.0000\n"
        "  total usage    $0.0000\n"
        "  remaining      $7.0000\n"
        "  key limit      $3.0000 (remaining $3.0000)\n")
    assert run(server, "--json", "--text").code == 2


@pytest.mark.parametrize("mode, why", [("forbidden", "/credits refused (403)"),
                                       ("zeros", "/credits answered zeros")])
def test_falls_back_to_key(standin, mode, why):
    server = standin(api_key=KEY, balance=50, key_limit=20, credits_mode=mode)
    used = spend(server, 2)
    r = run(server, "--json")
    assert r.code == 0
    assert why in r.stderr and "balance from /key" in r.stderr
    [rec] = r.records()
    assert rec == {"total_credits": None, "total_usage": pytest.approx(used),
                   "remaining": pytest.approx(20 - used), "key_limit": 20.0,
                   "key_limit_remaining": pytest.approx(20 - used), "source": "key"}
    assert run(server, "--json", "--quiet").stderr == ""
    text = run(server, "--text").stdout.decode()
    assert "from /key" in text and "total credits  unknown" in text


def test_min_threshold(standin):
    server = standin(api_key=KEY, balance=10)
    used = spend(server, 2)
    left = 10 - used
    assert run(server, "--min", f"{left - 0.001:.6f}").code == 0
    r = run(server, "--min", f"{left + 0.001:.6f}")
    assert r.code == 3
    assert r.records()[0]["remaining"] == pytest.approx(left)     # the record still prints
    assert "below --min" in r.stderr and len(r.stderr.splitlines()) == 1


def test_min_uses_the_key_limit_when_it_is_lower(standin):
    server = standin(api_key=KEY, balance=100, key_limit=2)
    assert run(server, "--min", "1.5").code == 0
    assert run(server, "--min", "5").code == 3
    server.configure(key_limit=10, balance=4)
    assert run(server, "--min", "5").code == 3


def test_min_with_an_unknown_balance_fails_safe(standin):
    server = standin(api_key=KEY, credits_mode="forbidden")          # and no key limit
    r = run(server, "--json")
    assert r.code == 0 and r.records()[0]["remaining"] is None
    r = run(server, "--min", "1")
    assert r.code == 1 and "balance is unknown" in r.stderr


def test_wrong_key_is_exit_2_without_the_key(standin):
    server = standin(api_key="sk-or-the-right-one")
    r = run(server, "--json")                       # sends KEY, which is wrong
    assert r.code == 2 and r.stdout == b""
    assert r.stderr.startswith("kp-credits: OpenRouter refused the API key (401")
    assert len(r.stderr.splitlines()) == 1


def test_network_error_is_exit_1(tmp_path):
    with socket.socket() as s:  # a port nobody listens on: bound, not listening, held
        s.bind(("127.0.0.1", 0))  # (so no other process can take it while kp-credits runs)
        port = s.getsockname()[1]
        r = kp("credits", "--base-url", f"http://127.0.0.1:{port}/api/v1", "--timeout", "5",
               env={"OPENROUTER_API_KEY": KEY})
    assert r.code == 1 and r.stdout == b""
    assert r.stderr.startswith("kp-credits: cannot reach OpenRouter at http://127.0.0.1:")
    assert KEY not in r.stderr and len(r.stderr.splitlines()) == 1


def test_no_key_is_exit_2(standin):
    server = standin()
    r = kp("credits", "--base-url", server.base_url, env={"OPENROUTER_API_KEY": ""})
    assert r.code == 2 and "OPENROUTER_API_KEY" in r.stderr


def test_api_key_file_and_base_url_flag(standin, tmp_path):
    server = standin(api_key=KEY, balance=9)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    r = kp("credits", "--api-key-file", key_file, "--base-url", server.base_url, "--json",
           env={"OPENROUTER_API_KEY": "", "OPENROUTER_BASE_URL": "http://127.0.0.1:9/api/v1"})
    assert r.code == 0 and r.records()[0]["total_credits"] == 9.0
    key_file.write_text("sk-or-v1-wrong-key-in-a-file\n")
    r = kp("credits", "--api-key-file", key_file, "--base-url", server.base_url)
    assert r.code == 2 and "sk-or-v1-wrong-key-in-a-file" not in r.stderr + r.stdout.decode()
    r = kp("credits", "--api-key-file", tmp_path / "missing", "--base-url", server.base_url)
    assert r.code == 2 and "cannot read --api-key-file" in r.stderr


def test_library_sync_and_async(standin):
    server = standin(api_key=KEY, balance=3, key_limit=1)
    used = spend(server, 1)
    b = fetch_balance(KEY, server.base_url)
    assert (b.source, b.total_credits, b.key_limit) == ("credits", 3.0, 1.0)
    assert b.spendable == pytest.approx(1 - used)

    async def read():
        async with Account(KEY, server.base_url) as account:
            return await account.balance(), await account.endpoints(MODEL)

    balance, endpoints = asyncio.run(read())
    assert balance == b and {e.quantization for e in endpoints} >= {"int4", "unknown"}
    with pytest.raises(AuthError):
        fetch_balance("sk-or-nope", server.base_url)
    server.configure(credits_mode="zeros")
    assert fetch_balance(KEY, server.base_url).source == "key"
    port = server.port
    server.stop()
    with pytest.raises(NetworkError) as err:
        fetch_balance(KEY, f"http://127.0.0.1:{port}/api/v1", timeout=5)
    assert KEY not in str(err.value)
    assert str(err.value).startswith(f"cannot reach OpenRouter at http://127.0.0.1:{port}/api/v1/credits")


def test_balance_from_odd_answers():
    key = {"data": {"limit": None, "limit_remaining": None, "usage": 1.5}}
    with pytest.raises(AccountError, match="500"):
        balance_from(500, {"error": {"code": 500, "message": "boom"}}, 200, key)
    with pytest.raises(AccountError, match="without a `data` object"):
        balance_from(200, {"data": {"total_credits": 5, "total_usage": 1}}, 200, {"x": 1})
    b = balance_from(404, None, 200, key)
    assert b.source == "key" and b.remaining is None and b.total_usage == 1.5
    assert json.loads(json.dumps(b.record()))["source"] == "key"


def test_account_honours_the_proxy_given_or_in_the_environment(standin, monkeypatch):
    server = standin(api_key=KEY, balance=3)
    with socket.socket() as s:  # a proxy nobody listens on: bound, not listening, held
        s.bind(("127.0.0.1", 0))  # (so no other process takes the port during the test)
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                     "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        assert fetch_balance(KEY, server.base_url).total_credits == 3.0
        with pytest.raises(NetworkError) as err:        # the `proxy` argument
            fetch_balance(KEY, server.base_url, proxy=dead, timeout=5)
        assert str(err.value).startswith(f"cannot reach OpenRouter at {server.base_url}/credits")
        assert KEY not in str(err.value)
        monkeypatch.setenv("HTTP_PROXY", dead)          # trust_env: the environment's proxy
        with pytest.raises(NetworkError):
            fetch_balance(KEY, server.base_url, timeout=5)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert fetch_balance(KEY, server.base_url).total_credits == 3.0
