"""Shared test helpers: run the kp-* commands as a user does, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    code: int
    stdout: bytes
    stderr: str

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines()]


def kp(command: str, *args, input: bytes | None = None, env: dict | None = None,
       cwd: str | os.PathLike | None = None, timeout: float = 120) -> Result:
    """Run `kp-<command> ARGS` as a subprocess; return its exit code, stdout and stderr."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [str(BIN / f"kp-{command}"), *map(str, args)],
        input=input if input is not None else b"", capture_output=True, env=full_env,
        cwd=cwd, timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard
        data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def write_jsonl(path: str | os.PathLike, rows: list) -> Path:
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return Path(path)


@pytest.fixture
def kp_run():
    return kp


@pytest.fixture
def standin(tmp_path):
    """Factory: `server = standin(balance=5, faults={"429": 0.1}, latency=0.05, ledger=True)`
    starts `python -m kimipipe.standin` on a free port (see kimipipe/standin/testing.py);
    every server started is stopped at teardown."""
    from kimipipe.standin.testing import StandIn

    servers = []

    def start(**kwargs):
        kwargs.setdefault("workdir", tmp_path / f"standin-{len(servers)}")
        server = StandIn(**kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


# --- kp-tokenize: the bundled Kimi-shaped tokenizer directories (both kinds) ---
TOKENIZERS = REPO / "kimipipe" / "data" / "tokenizers"
TOKENIZER_KINDS = {
    "fast": TOKENIZERS / "kimi-k2.5-mini-fast",  # tokenizer.json (tokenizers library)
    "tiktoken": TOKENIZERS / "kimi-k2.5-mini-tiktoken",  # tokenization_kimi.py, trust_remote_code
}


@pytest.fixture(params=sorted(TOKENIZER_KINDS))
def kimi_tokenizer(request) -> Path:
    """Each bundled Kimi-shaped tokenizer directory in turn (load with trust_remote_code)."""
    return TOKENIZER_KINDS[request.param]


def response_record(rid: str, messages, content: str, reasoning: str | None = None,
                    finish_reason: str | None = "stop", dataset: str = "T") -> dict:
    """A kp-infer response record, as kp-tokenize reads it."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    response = {"content": content}
    if reasoning is not None:
        response["reasoning"] = reasoning
    return {"id": rid, "dataset": dataset, "messages": messages, "response": response,
            "finish_reason": finish_reason, "model": "moonshotai/kimi-k2.5", "provider": "P",
            "generation_id": f"gen-{rid}",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "reasoning_tokens": 0, "cost": 0.0}}
