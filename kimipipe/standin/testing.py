"""Start a stand-in as a subprocess and talk to it: for tests, benchmarks and the demo.

    with StandIn(balance=5, faults={"429": 0.1}, latency=0.05, ledger=True) as server:
        env = {"OPENROUTER_BASE_URL": server.base_url, "OPENROUTER_API_KEY": server.api_key}
        ...
        server.configure(balance=0.01)      # e.g. provoke a 402 mid-run
        assert server.stats()["charged"] == len(server.ledger())

Keyword arguments map to the command-line options of `python -m kimipipe.standin`
(`faults` is a dict {kind: rate}; `ledger=True` puts the ledger in the work directory,
a string or path puts it there). The credit limits: `inflight_ratio`, `settle`,
`key_limit`, `workspace_budget`, `guardrail_budget`, `limit_status` (403|402),
`limit_reset`, `moderation_marker`; the provider quirks: `drop_reasoning` (a dict
{provider: rate}), `inline_reasoning` and `ignore_sampling` (lists of providers),
`logprobs` ({provider: variant}: token logprobs, kimipipe/standin/logprobs.py),
`not_distillable`; the wire's variants: `stream_usage` ("own-chunk"|"finish-chunk"),
`midstream_code`, `unavailable` (an availability code), `endpoint_nulls`; `impostors`
({provider: N or (N, how)}: serving another model from its N-th answer,
kimipipe/standin/impostors.py); billing:
`price_overrides` ({provider: factor or (factor, min_prompt_tokens)}), `discounts`
({provider: discount}), `no_cost`, `no_usage`, `generation_delay`
(kimipipe/standin/billing.py); a self-hosted server's API instead: `mode` ("vllm" or
"sglang": `base_url` ends /v1), `noncanonical`, `system_prompt`
(kimipipe/standin/selfhosted.py). Each can also be changed live with `configure(...)`
(billing's as `price_overrides`, `discounts`, `no_cost_rate`, `no_usage_rate`,
`generation_delay`); so can
`hold_after=N` (live only: the completions after the first N wait, counted in stats'
`held`, until it is raised or set to None), which lets a test act while a run provably
has work left. Only the standard library is used to talk to the server,
so any test can use it whatever its own event loop does.

How the server starts: `START = "exec"` (the default) runs `python -m kimipipe.standin` as a
user does; `"fork"` forks the calling process with the server's code already imported and
runs the same `main()` in the child (its own process, pid, port, log and exit code, with
the caller's descriptors closed), for ~0.02 CPU-s instead of the ~0.3 a fresh interpreter
spends importing aiohttp. The test suite, which starts ~400 stand-ins, sets it
(tests/conftest.py); `StandIn(start="exec")` keeps one test on the real command. It sets
`PRELOAD_TOKENIZERS` too: a stand-in counting with a tokenizer (`tokenizer=DIR`) is forked
with it loaded (once per test process, ~0.6 CPU-s, instead of in every stand-in).
"""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
import warnings
from pathlib import Path

DEFAULT_API_KEY = "sk-or-standin"
START = "exec"  # or "fork": see the module's text
# With START "fork": a stand-in's --tokenizer is loaded in the forking process first
# (token_counts.counter_for keeps it), so each forked stand-in starts with it loaded
PRELOAD_TOKENIZERS = False


class _Forked:
    """The part of subprocess.Popen that StandIn and its tests use, for a forked child."""

    def __init__(self, argv: list[str], log_path: Path):
        import kimipipe.standin.__main__  # noqa: F401  (imported once, here, not in each child)

        if PRELOAD_TOKENIZERS and "--tokenizer" in argv:
            from .token_counts import counter_for
            counter_for(argv[argv.index("--tokenizer") + 1])

        self.returncode: int | None = None
        with warnings.catch_warnings():  # 3.12+ warns on fork in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _run_forked(argv, log_path)  # never returns
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its status lost (as Popen)
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["kimipipe.standin"], timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_forked(argv: list[str], log_path: Path) -> None:
    """In the forked child: become `python -m kimipipe.standin ARGV` with stdout and stderr
    on LOG_PATH, nothing of the parent's open, and exit without the parent's atexit work."""
    code = 1
    try:
        gc.freeze()  # the parent's objects: never scanned (or copied) by this child's collector
        for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGHUP, signal.SIGUSR1,
                    signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.setitimer(signal.ITIMER_REAL, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        sys.argv = ["kimipipe.standin", *argv]
        if "logging" in sys.modules:  # the parent's handlers (pytest's capture): not ours
            import logging

            logging.root.handlers.clear()
        from kimipipe.standin.__main__ import main

        main(argv)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class StandInError(RuntimeError):
    pass


class StandIn:
    """A stand-in server in a subprocess on a free port of 127.0.0.1."""

    def __init__(self, *, api_key: str = DEFAULT_API_KEY, balance: float | None = None,
                 key_limit: float | None = None, credits_mode: str | None = None,
                 latency: float | None = None, tokens_per_second: float | None = None,
                 keepalive_interval: float | None = None, faults: dict | None = None,
                 retry_after: float | None = None, hang_seconds: float | None = None,
                 seed: int | None = None, ledger: bool | str | os.PathLike = False,
                 price_scale: float | None = None, bill_cancelled: bool = False,
                 request_log: bool = False,
                 inflight_ratio: float | None = None, settle: float | None = None,
                 workspace_budget: float | None = None, guardrail_budget: float | None = None,
                 limit_status: int | None = None, limit_reset: str | None = None,
                 moderation_marker: str | None = None, drop_reasoning: dict | None = None,
                 inline_reasoning: list | tuple = (), ignore_sampling: list | tuple = (),
                 unopened_reasoning: list | tuple = (), logprobs: dict | None = None,
                 impostors: dict | None = None, usage_offsets: dict | None = None,
                 not_distillable: bool = False,
                 stream_usage: str | None = None, midstream_code: str | None = None,
                 unavailable: str | None = None, endpoint_nulls: bool = False,
                 price_overrides: dict | None = None, discounts: dict | None = None,
                 no_cost: float | None = None, no_usage: float | None = None,
                 generation_delay: float | None = None, tokenizer: str | os.PathLike | None = None,
                 mode: str | None = None, noncanonical: float | None = None,
                 system_prompt: str | None = None, served_model_name: str | None = None,
                 port: int = 0,
                 workdir: str | os.PathLike | None = None, extra_args: tuple = (),
                 start_timeout: float = 20.0, start: str | None = None):
        self.api_key = api_key
        self.start_how = start or START
        if self.start_how not in ("exec", "fork"):
            raise ValueError(f"start must be 'exec' or 'fork', not {self.start_how!r}")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kp-standin-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        if ledger is True:
            self.ledger_path: Path | None = self.workdir / "ledger.jsonl"
        elif ledger:
            self.ledger_path = Path(ledger)
        else:
            self.ledger_path = None
        self.request_log_path = self.workdir / "requests.jsonl" if request_log else None
        self.port_file = self.workdir / "port"
        self.log_path = self.workdir / "standin.log"
        args = ["--port", str(port), "--port-file", str(self.port_file), "--api-key", api_key]
        options = {"--balance": balance, "--key-limit": key_limit,
                   "--credits-mode": credits_mode, "--latency": latency,
                   "--tokens-per-second": tokens_per_second,
                   "--keepalive-interval": keepalive_interval, "--retry-after": retry_after,
                   "--hang-seconds": hang_seconds, "--seed": seed,
                   "--price-scale": price_scale, "--ledger": self.ledger_path,
                   "--request-log": self.request_log_path,
                   "--inflight-ratio": inflight_ratio, "--settle": settle,
                   "--workspace-budget": workspace_budget, "--guardrail-budget": guardrail_budget,
                   "--limit-status": limit_status, "--limit-reset": limit_reset,
                   "--moderation-marker": moderation_marker, "--no-cost": no_cost,
                   "--no-usage": no_usage, "--generation-delay": generation_delay,
                   "--tokenizer": tokenizer, "--mode": mode, "--noncanonical": noncanonical,
                   "--system-prompt": system_prompt, "--served-model-name": served_model_name}
        for flag, value in options.items():
            if value is not None:
                args += [flag, str(value)]
        for kind, rate in (faults or {}).items():
            args += ["--fault", f"{kind}={rate}"]
        if bill_cancelled:
            args.append("--bill-cancelled")
        for provider, rate in (drop_reasoning or {}).items():
            args += ["--drop-reasoning", f"{provider}={rate}"]
        for provider in inline_reasoning:
            args += ["--inline-reasoning", provider]
        for provider in unopened_reasoning:
            args += ["--unopened-reasoning", provider]
        for provider in ignore_sampling:
            args += ["--ignore-sampling", provider]
        for provider, variant in (logprobs or {}).items():
            args += ["--logprobs", f"{provider}={variant}"]
        for provider, spec in (impostors or {}).items():  # N, or (N, how)
            after, how = spec if isinstance(spec, (tuple, list)) else (spec, "words")
            args += ["--impostor", f"{provider}={after}:{how}"]
        for provider, tokens in (usage_offsets or {}).items():
            args += ["--usage-offset", f"{provider}={tokens}"]
        if not_distillable:
            args.append("--not-distillable")
        for flag, value in (("--stream-usage", stream_usage), ("--midstream-code", midstream_code),
                            ("--unavailable", unavailable)):
            if value is not None:
                args += [flag, value]
        if endpoint_nulls:
            args.append("--endpoint-nulls")
        for provider, factor in (price_overrides or {}).items():  # factor, or (factor, min)
            factor, min_prompt = factor if isinstance(factor, (tuple, list)) else (factor, None)
            args += ["--price-override", f"{provider}={factor}"
                     + (f":{min_prompt}" if min_prompt is not None else "")]
        for provider, discount in (discounts or {}).items():
            args += ["--discount", f"{provider}={discount}"]
        self.args = [*args, *map(str, extra_args)]
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.mode = mode or "openrouter"

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> StandIn:
        if self.port_file.exists():
            self.port_file.unlink()
        self._log = open(self.log_path, "ab")
        if self.start_how == "fork":
            self.proc = _Forked(self.args, self.log_path)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "kimipipe.standin", *self.args],
                                         stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=self._log)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise StandInError(f"stand-in exited with {self.proc.returncode}: {self.log()}")
            if self.port_file.exists():
                text = self.port_file.read_text().strip()
                if text:
                    self.port = int(text)
                    try:
                        self.stats()
                        return self
                    except OSError:
                        pass
            if time.monotonic() > deadline:
                self.stop()
                raise StandInError(f"stand-in did not start within {self.start_timeout}s: "
                                   f"{self.log()}")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed; returns the exit code."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            code = proc.returncode
            self._log.close()
        if self._own_workdir and self.ledger_path is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def __enter__(self) -> StandIn:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addresses ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        # a self-hosted mode (vllm, sglang) serves under /v1 as those servers do
        return f"{self.url}/api/v1" if self.mode == "openrouter" else f"{self.url}/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point kimipipe's commands at this stand-in."""
        return {"OPENROUTER_BASE_URL": self.base_url, "OPENROUTER_API_KEY": self.api_key}

    # -- control ------------------------------------------------------------------------
    def _call(self, method: str, path: str, payload: dict | None = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise StandInError(f"{method} {path}: {e.code} {e.read().decode()}") from None

    def stats(self) -> dict:
        return self._call("GET", "/_standin/stats")

    def configure(self, **changes) -> dict:
        """Change balance, faults, latency, key_limit, inflight_ratio, drop_reasoning, ...
        live (every setting but the key, the port, the seed and the log files)."""
        return self._call("POST", "/_standin/config", changes)

    def ledger(self) -> list[dict]:
        if self.ledger_path is None or not self.ledger_path.exists():
            return []
        with open(self.ledger_path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def requests(self) -> list[dict]:
        """The completion request bodies the server received (needs request_log=True)."""
        if self.request_log_path is None:
            raise StandInError("start the stand-in with request_log=True to read its requests")
        if not self.request_log_path.exists():
            return []
        with open(self.request_log_path, "rb") as f:
            return [json.loads(line) for line in f if line.strip()]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
