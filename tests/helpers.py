"""Helpers more than one test file uses: the commands' table, talking to the stand-in,
waiting on a condition, reading a file another process is writing.

(Fixtures and the `kp` runner live in conftest.py; what one file alone needs stays there.)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter

import httpx

# The kp-* commands, in pipeline order: setup.cfg's console_scripts (tests/test_filters.py
# checks the two agree; its COMMANDS table says how each is driven).
KP_COMMANDS = ("prompts", "infer", "tokenize", "shard", "credits")

MODEL = "moonshotai/kimi-k2.5"
CLIENT = httpx.Client(timeout=30.0)  # one pool: a new client per request costs ~25 ms


def body(text="What is 2+2?", **extra) -> dict:
    """A chat completion request's body."""
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def post(server, payload, key=None, raw=None) -> httpx.Response:
    """POST /chat/completions to SERVER (the stand-in) with its key (or KEY); RAW: bytes
    sent as they are instead of PAYLOAD as JSON."""
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    if raw is not None:
        return CLIENT.post(server.base_url + "/chat/completions", content=raw, headers=headers)
    return CLIENT.post(server.base_url + "/chat/completions", json=payload, headers=headers)


def get(server, path, key=None, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    return CLIENT.get(server.base_url + path, headers=headers, params=params)


def billed(server) -> float:
    """What the stand-in billed, by its ledger (`standin(ledger=True)`)."""
    return sum(x["cost"] for x in server.ledger())


# When pytest-timeout ends the running test (time.monotonic()), set by conftest.py as each
# test starts: a command's own timeout must come first, so a hang fails with its output.
TEST_DEADLINE: float | None = None


def time_left(margin: float = 20.0) -> float:
    """Seconds a command may still run in this test: until pytest's timeout, less MARGIN
    (for the test to report). Give it as a command's timeout where the command may be
    slow, so a hang is that command's TimeoutExpired, its output shown, and not pytest
    killing the test with the output lost."""
    if TEST_DEADLINE is None:
        return 240.0
    return max(5.0, TEST_DEADLINE - time.monotonic() - margin)


def wait_for(predicate, what: str = "the condition", timeout: float = 120.0) -> None:
    """Poll PREDICATE until it holds (an event: a counter, a file's lines, a state), failing
    after TIMEOUT seconds, which only a hang reaches."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stderr_after(proc, act, timeout: float = 120.0) -> bytes:
    """ACT (what the test does while PROC runs), then PROC's stderr once it has exited (within
    TIMEOUT); if anything fails first, PROC is killed and reaped, so no command outlives its
    test."""
    try:
        act()
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def whole_lines(path) -> list[dict]:
    """The whole records of a file another process is appending to, or that a killed writer
    left with a torn last line (the part after the last newline is left out)."""
    data = path.read_bytes() if path.exists() else b""
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def smallest_hashes(ids, n) -> set[str]:
    """The N IDs of smallest SHA-256: what --sample N and SAMPLE_D=N answer."""
    return set(sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:n])


def children(pid: int, cmdline_has: bytes = b"") -> list[int]:
    """The processes whose parent is PID and whose command line holds CMDLINE_HAS (from
    /proc; a forked child without an exec has its parent's command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and cmdline_has in cmdline:
            found.append(int(entry))
    return found


def paid_once_each(server, prompts_path) -> None:
    """The stand-in billed every prompt of PROMPTS_PATH exactly once."""
    from kimipipe.standin.answers import user_text_sha256
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    expected = {user_text_sha256(p["messages"]) for p in whole_lines(prompts_path)}
    assert set(paid) == expected and set(paid.values()) == {1}


def endpoints_table(server) -> list[dict]:
    """The stand-in's endpoints table, prices as it bills them (USD per token)."""
    doc = httpx.get(f"{server.base_url}/models/{MODEL}/endpoints").json()
    return doc["data"]["endpoints"]


def money_is_exact(server, records, failures=()):
    """Every answer billed is in a record (kept or refused before it) or a failure line."""
    import pytest
    billed = {x["generation_id"]: x["cost"] for x in server.ledger()}
    kept = {r["generation_id"]: r["usage"]["cost"] for r in records}
    refused = {x["generation_id"]: x["cost"] for r in [*records, *failures] for x in r["refused"]}
    assert not set(kept) & set(refused)
    assert {**kept, **refused} == pytest.approx(billed, rel=1e-12)
    assert sum(f["cost"] for f in failures) == pytest.approx(
        sum(x["cost"] for f in failures for x in f["refused"]), rel=1e-12)


# Each money cap as kp-infer is given it: --max-cost; --total-cost alone; --total-cost with
# --reservations, as make passes TOTAL_COST (docs/money.md's table has a column for each)
CAPS = {
    "max-cost": lambda tmp, usd: ("--max-cost", f"{usd}"),
    "total-cost": lambda tmp, usd: ("--total-cost", f"{usd}"),
    "total-cost-shared": lambda tmp, usd: ("--total-cost", f"{usd}", "--reservations",
                                           tmp / "total-cost.json"),
}


def cap_reached(cap: str) -> str:
    """What kp-infer says when the cap CAP (a CAPS key) stops it."""
    return f"--{cap.removesuffix('-shared')} reached"
