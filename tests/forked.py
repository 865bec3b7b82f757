"""The kp-* commands started from a fork of a process that has already imported them.

Each `kp-<command>` a test runs (conftest.py:kp) is a process of its own, as a user's is: its
own pid, argv, environment, working directory, pipes for stdin, stdout and stderr, signal
dispositions and exit code, and Python's normal shutdown at the end. What it skips is the
interpreter's start and the import of the command's code (~0.25 CPU-s for kp-infer, ~0.15
for kp-shard, of ~0.45 and ~0.2 a typical run costs): a server process, started once per
test process with the same environment, imports every command's entry point (the
console_scripts of setup.cfg, through importlib.metadata) and nothing else, and forks a
child per run. The child becomes the command: its descriptors are the test's pipes (passed
over a Unix socket), everything else of the server's is closed, and it calls the entry
point as the `kp-<command>` script does: `sys.exit(main())`. Nothing has run in the server
but those imports, so each child starts from the state a fresh `kp-<command>` has once
its imports are done. A second, warm server has also imported transformers as a
tokenizer's load does; kp-tokenize and kp-infer --tokenizer fork from it when what
transformers reads as it is imported is the same for the run (`Servers`), else the child
imports it itself, under its own environment. make's builds reach the same servers
through shims in BIN (`Servers.shim_bin`, `client_main`): the command gets make's own
descriptors, the shim passes signals on, ends as the command did, and a killed shim's
command is killed.

What a fork does not redo is what the interpreter decides as it starts: the `PYTHON*`
variables, the locale and stdio encoding (from LANG and LC_*), and the hash seed, which
all children of one server share. So a run whose environment differs from the server's in
any of those is started from the interpreter as before (conftest.kp), and the tests that
are about the start itself (the console scripts, what a command imports, a sitecustomize)
run the scripts (`kp(..., start="exec")`, or subprocess with BIN/kp-*). KP_EXEC=1 runs
every command the old way, to compare.

Run as a script (`python forked.py SOCKET [--warm]`), this file is the server: it serves until its
stdin, a pipe from the test process, reaches EOF (the test process has gone).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What a fork cannot change once the interpreter has started (see above)
_SET_AT_START = ("PYTHON", "LC_", "LANG")


# Variables the test process's own imports may have set (kimipipe.tokenize makes the
# environment offline), with the values the suite started with (None: unset), for the
# servers to start with: conftest.py fills it
AS_STARTED: dict[str, str | None] = {}


def _at_start(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_SET_AT_START)}


# --- the test process's side --------------------------------------------------------------

class Server:
    """A forking server of one test process, started at its first run; WARM: with
    transformers imported too, as kp-tokenize and kp-infer --tokenizer import it (see
    `Servers`)."""

    def __init__(self, warm: bool = False) -> None:
        self.warm = warm
        self.proc: subprocess.Popen | None = None
        self.path = ""
        self.env: dict = {}
        self.runs = 0  # commands run through it
        self.broken = False
        self.last_pid: int | None = None

    def _start(self) -> None:
        directory = tempfile.mkdtemp(prefix="kp-forked-")
        _made.append(directory)
        self.path = os.path.join(directory, "socket")
        self.env = {**os.environ, **{k: v for k, v in AS_STARTED.items() if v is not None}}
        for k in [k for k, v in AS_STARTED.items() if v is None]:
            self.env.pop(k, None)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path, *(["--warm"] if self.warm else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(directory, "log"), "wb"),
            env=self.env, cwd=directory, close_fds=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.path + ".ready"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = Path(directory, "log").read_text(errors="replace")
                raise RuntimeError(f"the kp-* fork server did not start: {log[-2000:]}")
            time.sleep(0.01)

    def can_run(self, env: dict) -> bool:
        """Whether a child of this server starts as the interpreter would under ENV (False
        where the server cannot run here: every command is then exec'd, said once)."""
        if self.broken:
            return False
        if self.proc is None or self.proc.poll() is not None:
            try:
                self._start()
            except RuntimeError as e:
                self.broken = True
                print(f"tests/forked.py: the commands are exec'd: {e}", file=sys.stderr)
                return False
        return _at_start(env) == _at_start(self.env)

    def run(self, argv: list[str], input: bytes, env: dict, cwd: str | None,
            timeout: float | None) -> tuple[int, bytes, bytes]:
        """ARGV (BIN/kp-<command>, its arguments) run as a forked child: its exit code,
        stdout and stderr, as subprocess.run(capture_output=True) gives them."""
        command = os.path.basename(argv[0])
        request = json.dumps({"command": command, "argv": argv, "env": env,
                              "cwd": os.path.abspath(cwd or os.getcwd())}).encode()
        ends = [os.pipe(), os.pipe(), os.pipe()]  # stdin, stdout, stderr: (read, write)
        theirs = [ends[0][0], ends[1][1], ends[2][1]]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            socket.send_fds(sock, [struct.pack("!I", len(request)) + request], theirs)
        finally:
            for fd in theirs:
                os.close(fd)
        stdin, stdout, stderr = ends[0][1], ends[1][0], ends[2][0]
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err, reply = bytearray(), bytearray(), bytearray()
        pid = None
        code = None
        sel = selectors.DefaultSelector()
        try:
            os.set_blocking(stdin, False)
            pending = memoryview(input)
            if pending:
                sel.register(stdin, selectors.EVENT_WRITE, "stdin")
            else:
                os.close(stdin)
                stdin = None
            sel.register(stdout, selectors.EVENT_READ, out)
            sel.register(stderr, selectors.EVENT_READ, err)
            sel.register(sock, selectors.EVENT_READ, reply)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if pid is None:  # (the server names the child first thing: wait for it)
                        pid = _pid_from(sock, reply)
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(argv, timeout, output=bytes(out),
                                                    stderr=bytes(err))
                for key, _ in sel.select(left):
                    if key.data == "stdin":
                        try:
                            n = os.write(stdin, pending[:65536])
                        except BrokenPipeError:
                            n = len(pending)
                        pending = pending[n:]
                        if not pending:
                            sel.unregister(stdin)
                            os.close(stdin)
                            stdin = None
                        continue
                    data = key.fileobj.recv(65536) if key.fileobj is sock else \
                        os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.extend(data)
                    while key.data is reply and b"\n" in reply:
                        line, _, rest = bytes(reply).partition(b"\n")
                        reply[:] = rest
                        message = json.loads(line)
                        if "pid" in message:
                            pid = self.last_pid = message["pid"]
                        else:
                            code = message["code"]
        finally:
            sel.close()
            sock.close()
            for fd in (stdin, stdout, stderr):
                if fd is not None:
                    os.close(fd)
        if code is None:
            raise RuntimeError(f"the kp-* fork server went away while {command} ran")
        self.runs += 1
        return code, bytes(out), bytes(err)

    @property
    def cpu(self) -> float:
        """CPU seconds of every child this server has seen end (this test process's runs,
        and those of make's shims, `Servers.shim_bin`)."""
        try:
            return float(Path(self.path + ".cpu").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0.0

    def running(self, wait: float = 5.0) -> bool:
        """Whether the last child started is still alive (a zombie is not), after waiting up
        to WAIT seconds for it to end."""
        if self.last_pid is None:
            return False
        deadline = time.monotonic() + wait
        while True:
            try:
                state = Path(f"/proc/{self.last_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return False
            if state in ("Z", "X") or time.monotonic() > deadline:
                return state not in ("Z", "X")
            time.sleep(0.02)


def _pid_from(sock: socket.socket, reply: bytearray) -> int | None:
    """The child's pid from the server's first reply line, read for up to 5 seconds."""
    sock.settimeout(5)
    try:
        while b"\n" not in reply:
            data = sock.recv(65536)
            if not data:
                return None
            reply.extend(data)
    except OSError:
        return None
    return json.loads(bytes(reply).partition(b"\n")[0]).get("pid")


# What a warm server's children may differ from its own environment in: the kp-* commands'
# own variables, pytest's (PYTEST_CURRENT_TEST changes with every test) and make's
# (MAKEFLAGS, MAKELEVEL, MFLAGS), which transformers does not read
_NOT_READ_BY_TRANSFORMERS = ("OPENROUTER_", "KP_", "PYTEST_", "MAKE", "MFLAGS")


def _differs_for_transformers(env: dict, base: dict) -> list[str]:
    """The variables of ENV and BASE that differ, of those transformers may read."""
    return sorted(k for k in set(env) | set(base)
                  if env.get(k) != base.get(k) and not k.startswith(_NOT_READ_BY_TRANSFORMERS))


def _needs_transformers(argv: list[str]) -> bool:
    command, args = os.path.basename(argv[0]), argv[1:]
    if "--debug" in args or "--help" in args:  # (--debug: transformers' log level, set at import)
        return False
    return command == "kp-tokenize" or (command == "kp-infer" and "--tokenizer" in args)


class Servers:
    """The two fork servers of a test process. Both import every command's entry point;
    the warm one, started when a run first needs it, has then made the environment offline
    as kp-tokenize does (tokenize/load.py `offline_environment`) and imported the parts of
    transformers, tokenizers and tiktoken a tokenizer's load imports (~0.8 CPU-s a start).
    A run of kp-tokenize, or kp-infer with --tokenizer, is forked from the warm one when
    its environment is the server's but for the commands' own variables (what transformers
    reads as it is imported: HF_*, HOME, XDG_CACHE_HOME, ... is then the same); otherwise
    from the cold one, and transformers is imported by the command itself."""

    def __init__(self) -> None:
        self.cold, self.hot = Server(), Server(warm=True)
        self.last: Server = self.cold
        self._shims: dict[str, str] = {}
        self.differs: list[str] = []  # what kept the last run off the warm server

    def can_run(self, env: dict) -> bool:
        return self.cold.can_run(env)

    def _warm_for(self, argv: list[str], env: dict) -> bool:
        if not _needs_transformers(argv) or not self.hot.can_run(env):  # (starts it)
            return False
        self.differs = _differs_for_transformers(env, self.hot.env)
        return not self.differs

    def run(self, argv: list[str], input: bytes, env: dict, cwd: str | None,
            timeout: float | None) -> tuple[int, bytes, bytes]:
        server = self.hot if self._warm_for(argv, env) else self.cold
        self.last = server
        return server.run(argv, input, env, cwd, timeout)

    @property
    def cpu(self) -> float:
        return self.cold.cpu + self.hot.cpu

    @property
    def runs(self) -> int:
        return self.cold.runs + self.hot.runs

    def running(self, wait: float = 5.0) -> bool:
        return self.last.running(wait)

    def shim_bin(self, real_bin: str | os.PathLike) -> str:
        """A directory for make's BIN: `kp-<command>` shims that have this test process's
        servers fork the command (`client_main`), and `python`, the venv's. Made once."""
        real_bin = os.fspath(real_bin)
        if real_bin in self._shims:
            return self._shims[real_bin]
        if not (self.cold.can_run(dict(os.environ)) and self.hot.can_run(dict(os.environ))):
            return real_bin
        directory = tempfile.mkdtemp(prefix="kp-shims-")
        _made.append(directory)
        config = os.path.join(directory, "servers.json")
        Path(config).write_text(json.dumps({
            "cold": self.cold.path, "hot": self.hot.path, "real_bin": real_bin,
            "at_start": _at_start(self.cold.env), "hot_env": self.hot.env}))
        here = os.path.dirname(os.path.abspath(__file__))
        for name in os.listdir(real_bin):
            if name.startswith("kp-"):
                script = (f"#!{sys.executable} -SE\nimport sys\nsys.path.insert(0, {here!r})\n"
                          f"import forked\nforked.client_main({config!r}, {name!r})\n")
            elif name == "python":
                script = f'#!/bin/sh\nexec {shlex.quote(os.path.join(real_bin, name))} "$@"\n'
            else:
                continue
            Path(directory, name).write_text(script)
            os.chmod(os.path.join(directory, name), 0o755)
        self._shims[real_bin] = directory
        return directory


def _make_command_line_names(env: dict) -> set[str]:
    """The variables make was given on its command line (`make all WORK=...`): make puts
    them in its recipes' environment, and lists them in MAKEFLAGS after ` -- `."""
    import re

    flags = env.get("MAKEFLAGS", "")
    if " -- " not in flags:
        return set()
    return set(re.findall(r"(?:^|(?<!\\) )([A-Za-z_][A-Za-z0-9_]*)=", flags.split(" -- ", 1)[1]))


def client_main(config_path: str, command: str) -> None:
    """A `kp-<command>` shim (Servers.shim_bin), as make starts it: the command forked by a
    server with this process's argv, environment, cwd and descriptors 0-2; the signals it
    is sent passed on; its exit code, or the signal that ended it, this process's. Where
    the environment changes what an interpreter reads at start, the script itself, exec'd.
    If this process is killed, the server kills the command (its connection closes)."""
    with open(config_path) as f:
        config = json.load(f)
    real = os.path.join(config["real_bin"], command)
    argv = [real, *sys.argv[1:]]
    env = dict(os.environ)
    if _at_start(env) != config["at_start"]:
        os.execv(real, argv)
    made = _make_command_line_names(env)  # (make exports them; transformers reads none)
    warm = _needs_transformers(argv) and not [
        k for k in _differs_for_transformers(env, config["hot_env"])
        if k not in made or k.startswith(("HF_", "TRANSFORMERS", "TOKENIZERS"))]
    child = []
    pending = []

    def forward(signum, frame):
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)
    # Before the request goes: from then on the command may be reading its input, and a
    # signal sent to this process must reach it (not end this one with a traceback)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                 signal.SIGUSR1, signal.SIGUSR2)
    for signum in forwarded:
        signal.signal(signum, forward)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(config["hot" if warm else "cold"])
    except OSError:  # (the test process has gone: its servers with it)
        for signum in forwarded:
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT
                          else signal.default_int_handler)
        if pending:
            os.kill(os.getpid(), pending[0])
        os.execv(real, argv)
    request = json.dumps({"command": command, "argv": argv, "env": env,
                          "cwd": os.getcwd()}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    reply = b""
    while True:
        data = sock.recv(65536)
        if not data:
            print(f"{command}: the test's fork server went away", file=sys.stderr)
            os._exit(70)
        reply += data
        while b"\n" in reply:
            line, reply = reply.split(b"\n", 1)
            message = json.loads(line)
            if "pid" in message:
                child.append(message["pid"])
                for signum in pending:
                    os.kill(child[0], signum)
                continue
            code = message["code"]
            if code < 0:  # ended by a signal: so does this process
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code if code >= 0 else 128 - code)


SERVER = Servers()
_made: list[str] = []  # the servers' and shims' directories, removed at exit


@atexit.register
def _clean_up() -> None:
    for server in (SERVER.cold, SERVER.hot):
        if server.proc is not None and server.proc.poll() is None:
            server.proc.stdin.close()  # (the server's EOF: it kills what still runs, and ends)
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
    for directory in _made:
        shutil.rmtree(directory, ignore_errors=True)


# --- the server -------------------------------------------------------------------------

def _serve(path: str, warm: bool):
    """Import every kp-* entry point (WARM: and transformers, see Servers), then fork a child
    per request; returns, in the child only, the entry point it is to run."""
    from importlib.metadata import entry_points

    mains = {ep.name: ep.load() for ep in entry_points(group="console_scripts")
             if ep.name.startswith("kp-")}
    if warm:
        _import_transformers()
    import gc

    gc.freeze()  # a child's collections skip what was imported: its pages stay shared (~3x less CPU)
    os.close(os.pidfd_open(os.getpid()))  # (Linux 5.3+: where it is missing, no server)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    Path(path + ".ready").touch()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(0, selectors.EVENT_READ, "parent")  # EOF: the test process has gone
    running: dict[int, socket.socket] = {}  # pid -> the connection of the test that asked
    cpu = 0.0  # of every child ended, written to PATH.cpu (Servers.cpu reads it)
    while True:
        for what in [key.data for key, _ in sel.select()]:
            if what == "parent":
                if not os.read(0, 4096):
                    for pid in running:
                        os.kill(pid, signal.SIGKILL)
                    os._exit(0)
            elif what == "listener":
                conn, _ = listener.accept()
                try:  # (an asker that dies before its request is whole must not hang
                    conn.settimeout(10)  # the server, and every run after it, on a recv)
                    request, fds = _receive(conn)
                    conn.settimeout(None)
                except (OSError, EOFError, struct.error, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    # the child: none of the server's descriptors, the asker's 0-2 as its own
                    sel.close()
                    for s in (listener, conn, *running.values()):
                        os.close(s.detach())
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # (the pidfds among them)
                    return mains[request["command"]], request
                for fd in fds:
                    os.close(fd)
                running[pid] = conn
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                sel.register(conn, selectors.EVENT_READ, ("asker", pid))
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            elif isinstance(what, tuple):  # the asker hung up (killed: a shim's SIGKILL, a
                _, pid = what                # test's timeout) before its child ended: so does it
                sel.unregister(running[pid])
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:  # child WHAT ended: its exit code and CPU to the one that asked for it
                pidfd = next(k.fd for k in sel.get_map().values() if k.data == what)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status, usage = os.wait4(what, 0)
                conn = running.pop(what)
                if conn.fileno() in sel.get_map():
                    sel.unregister(conn)
                cpu += usage.ru_utime + usage.ru_stime
                Path(path + ".cpu").write_text(f"{cpu:.6f}")
                try:
                    conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status),
                                             "cpu": usage.ru_utime + usage.ru_stime}).encode()
                                 + b"\n")
                except OSError:  # it gave up on it (a timeout)
                    pass
                conn.close()


def _import_transformers() -> None:
    import importlib

    from kimipipe.tokenize.load import offline_environment

    offline_environment()
    for name in ("transformers", "transformers.models.auto.tokenization_auto",
                 "transformers.configuration_utils", "transformers.dynamic_module_utils",
                 "transformers.tokenization_utils_base", "transformers.utils.chat_template_utils",
                 "transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils",
                 "transformers.tokenization_python", "transformers.convert_slow_tokenizer",
                 "tokenizers", "tiktoken", "jinja2"):
        try:
            importlib.import_module(name)
        except ImportError:  # (not in this version: imported by the command, if at all)
            pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise EOFError("request cut short")
        data += more
    return json.loads(data), fds


if __name__ == "__main__":
    main, request = _serve(sys.argv[1], "--warm" in sys.argv[2:])
    # Now the command, as its console script starts it (the script's directory first on
    # sys.path, in place of this file's)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(sys.argv[0])
    sys.argv[0] = sys.argv[0].removesuffix(".exe")
    sys.exit(main())
