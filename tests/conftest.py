"""Shared test helpers: run the kp-* commands as a user does, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import forked
import pytest

from kimipipe.standin import testing as _standin_testing

# pytest rewrites the test modules' asserts on import, ~4 CPU-s in each xdist worker, and
# caches the result only where bytecode may be written; PYTHONDONTWRITEBYTECODE (set in
# many containers, this project's CI among them) turns the cache off. In this process only
# (the commands the tests start still get the variable as set), so a rerun of the suite
# reads the rewritten modules from tests/__pycache__.
sys.dont_write_bytecode = False

# ~400 stand-ins start in a run of the suite: forked from the test process with the server's
# code imported (~0.02 CPU-s each) rather than a fresh `python -m kimipipe.standin` (~0.3,
# aiohttp's import). Same main(), own process; test_standin.py keeps the exec'd start.
_standin_testing.START = "fork"
_standin_testing.PRELOAD_TOKENIZERS = True  # (a tokenizer a stand-in counts with: loaded once)

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
# KP_EXEC=1: every kp-* command of `kp` started as its console script (forked.py)
EXEC_ALWAYS = os.environ.get("KP_EXEC") == "1"

# The environment the suite was started with. Importing kimipipe.tokenize sets
# HF_HUB_OFFLINE and friends in os.environ (kp-tokenize keeps itself offline that way);
# in the test process that would leak into every subprocess the suite starts, and hide
# whether each command keeps itself offline. They are put back as found after collection
# and around every test.
# The make runs of the suite pass VENV= this very venv; with the Makefile's VENV_DEPS
# empty they never reinstall it. Otherwise a checkout whose setup.cfg is newer than the
# venv's stamp (a git worktree, make mutants' scratch copy under /tmp) reinstalled the
# venv from itself, and every kp-* command then imported a tree that was gone ("No module
# named 'kimipipe'"), in this run and every other run on the venv.
os.environ["VENV_DEPS"] = ""
_STARTED_WITH = dict(os.environ)
_SET_BY_KIMIPIPE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                    "TRANSFORMERS_VERBOSITY", "TOKENIZERS_PARALLELISM")


forked.AS_STARTED.update({name: _STARTED_WITH.get(name) for name in _SET_BY_KIMIPIPE})


def restore_environment() -> None:
    """Also before every command `kp` runs, after every stand-in starts and in make's
    builds (test_make.py): a stand-in that counts with a tokenizer loads it in this process
    (kimipipe.standin.testing, PRELOAD_TOKENIZERS), which sets these mid-test; a kp-tokenize
    or kp-infer --tokenizer run with them set differs from the warm fork server's
    environment and ran on the cold one, importing transformers itself (~0.9 CPU-s a run,
    every run of the first such test of each test process)."""
    for name in _SET_BY_KIMIPIPE:
        if name in _STARTED_WITH:
            os.environ[name] = _STARTED_WITH[name]
        else:
            os.environ.pop(name, None)


def pytest_collection_finish(session):
    restore_environment()


# The long modules first, and shared out. `--dist worksteal` (the Makefile's) hands each
# of W workers one contiguous W-th of the collected order, and an idle worker then takes
# the back half of the longest queue: what stands at the front of a queue is run by its own
# worker. With the long modules merely first, one worker's share was all of them: it ran
# ~270 s of tests while the others ran out and stole its short tail, and the suite waited
# ~15 s at the end for its last 402-wait test. So each worker's share starts with its own
# long modules (whole modules, for their module-scoped fixtures: the make build of
# test_make), dealt by the seconds of wall each took (KP_CPU_LOG, two cores, 3 workers),
# and is filled up to its size with the rest in collection order. Order within a module is
# kept. Only the speed depends on this matching xdist's split; every order runs every test.
LONG_SECONDS = {"test_make.py": 90, "test_make_build.py": 70,
                "test_infer_credit_limits.py": 65, "test_locks.py": 12,
                "test_tokenize_fields.py": 30, "test_infer_disk.py": 30,
                "test_infer_conversations.py": 25, "test_total_cost.py": 25,
                "test_infer_retries.py": 12, "test_infer_progress.py": 11}


def pytest_collection_modifyitems(items):
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.path.name, []).append(item)
    heads: list[list] = [[] for _ in range(workers)]
    seconds = [0] * workers
    for name in sorted((n for n in LONG_SECONDS if n in modules), key=LONG_SECONDS.get,
                       reverse=True):
        k = seconds.index(min(seconds))
        heads[k] += modules[name]
        seconds[k] += LONG_SECONDS[name]
    rest = [item for item in items if item.path.name not in LONG_SECONDS]
    order: list = []
    for k in range(workers):  # worksteal's first split: len(left) // (workers left)
        size = (len(items) - len(order)) // (workers - k)
        take = max(0, size - len(heads[k]))
        order += heads[k] + rest[:take]
        del rest[:take]
    items[:] = order + rest


# KP_CPU_LOG=FILE: one line per test appended to FILE, "cpu-seconds wall-seconds end-time
# xdist-worker nodeid" (the end time as epoch seconds, to see each worker's timeline),
# the CPU being the test process's own plus that of every child it waited for (the
# commands, the stand-ins, make) over setup, call and teardown. On two shared cores the CPU
# is what limits the suite, so that is what to measure before making it faster.
_CPU_LOG = os.environ.get("KP_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time

    import helpers
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    helpers.TEST_DEADLINE = time.monotonic() + limit if limit > 0 else None
    if not _CPU_LOG:
        yield
        return
    import resource
    import time

    def cpu():
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
                + forked.SERVER.cpu)  # (the fork server's children: the commands it ran)

    cpu0, wall0 = cpu(), time.monotonic()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(_CPU_LOG, "a") as f:
        f.write(f"{cpu() - cpu0:.2f} {time.monotonic() - wall0:.2f} {time.time():.2f} {worker} "
                f"{item.nodeid}\n")


@pytest.fixture(autouse=True)
def _environment_as_started():
    restore_environment()
    yield
    restore_environment()


# In CI (CI=true, as the CI runner sets it) or with KP_NO_SKIP=1 (.ci/run sets it), a skip
# is an error: a test that skips because a tool is missing (the zstd CLI, openssl) would
# otherwise let CI pass without it.
NO_SKIP = os.environ.get("KP_NO_SKIP") == "1" or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_is_an_error(report) -> None:
    if NO_SKIP and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, and skips are errors in CI (CI / KP_NO_SKIP=1): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _skip_is_an_error(report)
    # A command that ran past its timeout: what it printed until then, beside the failure
    if call.excinfo is not None and isinstance(call.excinfo.value, subprocess.TimeoutExpired):
        expired = call.excinfo.value
        for name, data in (("stdout", expired.stdout), ("stderr", expired.stderr)):
            if data:
                text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
                report.sections.append((f"{name} of the command that timed out", text[-20000:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _skip_is_an_error(outcome.get_result())


@dataclass
class Result:
    code: int
    stdout: bytes
    stderr: str

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines()]


def kp(command: str, *args, input: bytes | None = None, env: dict | None = None,
       cwd: str | os.PathLike | None = None, timeout: float = 120,
       start: str = "fork") -> Result:
    """Run `kp-<command> ARGS` as a subprocess; return its exit code, stdout and stderr.
    START "fork": a child of the fork server that has the commands imported (forked.py:
    the process is the command's own, its interpreter start and imports skipped), unless
    ENV changes what the interpreter sets as it starts, or KP_EXEC=1; "exec": the
    console script, as a user's shell starts it."""
    argv = [str(BIN / f"kp-{command}"), *map(str, args)]
    restore_environment()
    full_env = {**os.environ, **(env or {})}
    data = input if input is not None else b""
    if start == "fork" and not EXEC_ALWAYS and forked.SERVER.can_run(full_env):
        code, stdout, stderr = forked.SERVER.run(argv, data, full_env, cwd, timeout)
        return Result(code, stdout, stderr.decode("utf-8", "replace"))
    proc = subprocess.run(argv, input=data, capture_output=True, env=full_env, cwd=cwd,
                          timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def tokenize_in_process(*args, input: bytes | None = None) -> Result:
    """`kp-tokenize ARGS` run in this test process (its entry point, `main(argv)`, under
    click's CliRunner isolation: stdin, stdout and stderr its own), for the tests of what the
    engine makes of records (IDs, rejects, refusals, the flags that shape them) rather than
    of the process around it. A subprocess first imports transformers, ~0.8 CPU-s each
    time; here that import is paid once per test process and a bundled tokenizer loads in
    ~0.05. Workers, signals, locks, pipes and the environment are the subprocess tests'
    (`kp`): ARGS must say `--workers 1`, since a pool would fork the test process."""
    from click.testing import CliRunner

    from kimipipe.commands.tokenize import main

    argv = [str(a) for a in args]
    assert "--workers" in argv and argv[argv.index("--workers") + 1] == "1", argv
    code = None
    with CliRunner().isolation(input=input or b"") as (stdout, stderr, _):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code
    return Result(code, stdout.getvalue(), stderr.getvalue().decode("utf-8", "replace"))


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
    starts the stand-in on a free port (forked: see kimipipe/standin/testing.py);
    every server started is stopped at teardown."""
    from kimipipe.standin.testing import StandIn

    servers = []

    def start(**kwargs):
        kwargs.setdefault("workdir", tmp_path / f"standin-{len(servers)}")
        server = StandIn(**kwargs)
        servers.append(server)
        server.start()
        restore_environment()  # (its tokenizer's load set HF_HUB_OFFLINE and friends here)
        return server

    yield start
    for server in servers:
        server.stop()


# --- kp-prompts: real public dataset files, read in place, never copied into the project:
# CI keeps them in ../shared/public-sources beside the clone (their origins and licences
# in its README.md); KP_PUBLIC_SOURCES points elsewhere.
PUBLIC_SOURCES = Path(os.environ.get("KP_PUBLIC_SOURCES")
                      or REPO.parent / "shared" / "public-sources")


def public_source(name: str) -> Path:
    """The public dataset file NAME; skips (an error in CI) when it is not there."""
    path = PUBLIC_SOURCES / name
    if not path.is_file():
        pytest.skip(f"the public dataset file {path} is not there "
                    "(set KP_PUBLIC_SOURCES to its directory)")
    return path


# --- kp-tokenize: the bundled Kimi-shaped tokenizer directories (both kinds) ---
TOKENIZERS = REPO / "kimipipe" / "data" / "tokenizers"
TOKENIZER_KINDS = {
    "fast": TOKENIZERS / "kimi-k2.5-mini-fast",  # tokenizer.json (tokenizers library)
    "tiktoken": TOKENIZERS / "kimi-k2.5-mini-tiktoken",  # tokenization_kimi.py, trust_remote_code
}


# Kimi K2.5's real tokenizer files (tests/README.md): CI keeps them in ../shared beside the
# clone; KP_KIMI_TOKENIZER points elsewhere. They have no chat template, so the tests give
# them the project's K2.5 template in a directory of links (as a user adds one).
REAL_TOKENIZER = Path(os.environ.get("KP_KIMI_TOKENIZER")
                      or REPO.parent / "shared" / "kimi-k2.5-tokenizer")
ALL_KINDS = (*sorted(TOKENIZER_KINDS), "real")


@pytest.fixture(scope="session")
def real_tokenizer(tmp_path_factory) -> Path:
    """Kimi K2.5's real tokenizer directory with the project's K2.5 chat template; skips
    (an error in CI) when the files are not there."""
    if not (REAL_TOKENIZER / "tiktoken.model").is_file():
        pytest.skip(f"Kimi K2.5's real tokenizer files are not in {REAL_TOKENIZER} "
                    "(set KP_KIMI_TOKENIZER to their directory)")
    d = tmp_path_factory.mktemp("tokenizers") / "kimi-k2.5-real"
    d.mkdir()
    for f in sorted(REAL_TOKENIZER.iterdir()):
        if f.is_file():
            (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_bytes(
        (TOKENIZER_KINDS["tiktoken"] / "chat_template.jinja").read_bytes())
    return d


def tokenizer_dir(request, kind: str) -> Path:
    """The directory of tokenizer KIND: a bundled one, or the real one ("real")."""
    return request.getfixturevalue("real_tokenizer") if kind == "real" else TOKENIZER_KINDS[kind]


def is_tiktoken(directory: Path) -> bool:
    """Whether DIRECTORY is packaged as Kimi's is (tiktoken.model and its code)."""
    return (Path(directory) / "tiktoken.model").is_file()


@pytest.fixture(params=ALL_KINDS)
def kimi_tokenizer(request) -> Path:
    """Each Kimi tokenizer directory in turn: the two bundled Kimi-shaped ones and Kimi
    K2.5's real one (load with trust_remote_code)."""
    return tokenizer_dir(request, request.param)


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


def fake_hf_cache(hf_home: Path, directory: Path, repo_id: str = "moonshotai/Kimi-K2.5") -> dict:
    """A local Hugging Face cache holding DIRECTORY's files as REPO_ID's snapshot, laid out
    as the hub lays it (files are symlinks into blobs/); returns the variables that point
    the libraries at it."""
    import hashlib
    import shutil

    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for f in directory.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub")}
