"""One writer per output file: an exclusive lock taken for the whole run.

Two copies of a resumable stage on one output (a second terminal, `make all` rerun while
the first still runs, a requeued job) would each skip what the other has not yet written,
and both would do (and pay for) the rest. So a stage that appends to `-o FILE` first takes

    with OutputLock(FILE, "kp-tokenize", note=print_to_stderr):
        ... repair, resume, write ...

The lock is `flock(2)` on a hidden file beside the output, `.NAME.lock`, which holds who
took it (a JSON line, `contracts.LockHolder`: pid, host, since, command, output). A second process refuses at once with
`OutputLocked` (exit 2) naming the holder. Inputs (a `--done` file, the records read) are
never locked: reading a file another run is writing is allowed.

- The kernel releases a dead process's flock, so a lock left by a process killed on this
  host is taken over at once; the note callback is told whose it was.
- Over NFS, flock may or may not reach other hosts (it does not with `local_lock=flock`,
  or without a lock daemon). A lock file naming another host is therefore refused even
  when the flock is free: this host cannot tell whether that process still runs. The
  message says how to clear it (remove the lock file once that run is known to be over).
- The lock file is removed when the run ends, however it ends short of a kill. Removing a
  lock file another process might have opened is a known race of flock files; a process
  that locks a file and then finds the name no longer points at it tries again.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from collections.abc import Callable

import msgspec

from .contracts import LockHolder
from .errors import ExitCode, KPError


class OutputLocked(KPError):
    """Another run writes this output (or may: a lock from another host)."""

    exit_code = ExitCode.USAGE


def lock_path(output: str) -> str:
    """The lock file of OUTPUT: `.NAME.lock` in the same directory."""
    folder, name = os.path.split(output)
    return os.path.join(folder, f".{name}.lock")


def _host() -> str:
    return socket.gethostname()


def _describe(holder: LockHolder | None) -> str:
    holder = holder or LockHolder()
    pid = holder.pid if holder.pid is not None else "?"
    host = holder.host if holder.host is not None else "?"
    since = holder.since if holder.since is not None else "an unknown time"
    command = holder.command
    return f"{command + ' ' if command else ''}PID {pid} on {host} since {since}"


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """An exclusive lock on output file PATH for the run of COMMAND (`-`: stdout, no lock).

    `acquire()` (or `with`) takes it or raises OutputLocked; `release()` removes the lock
    file and lets go. NOTE, if given, is called with one line when a stale lock is taken
    over (so the caller prints it, or not, as --quiet says).
    """

    def __init__(self, path: str, command: str, note: Callable[[str], None] | None = None):
        self.path = path
        self.command = command
        self.note = note
        self.lock_file = None if path == "-" else lock_path(path)
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        if self.lock_file is None or self._fd is not None:
            return self
        for _ in range(100):  # the name was re-created under us: try the new file
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                flock_works = True
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise OutputLocked(
                    f"{self.path} is being written by {_describe(holder)} (lock {self.lock_file}); "
                    "wait for that run to end, or stop it, then rerun") from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                flock_works = False  # a filesystem without locks: the file's content decides
            if _same_file(fd, self.lock_file):
                break
            os.close(fd)
        else:
            raise OutputLocked(f"{self.path}: cannot take the lock {self.lock_file} (it keeps "
                               "being replaced)")
        self._fd = fd
        try:
            self._check_holder(_read(fd), flock_works)
        except BaseException:
            self._fd = None
            os.close(fd)  # (the lock file is someone else's: left as it is)
            raise
        record = LockHolder(
            pid=os.getpid(), host=_host(),
            since=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            command=self.command, output=os.path.abspath(self.path))
        os.ftruncate(fd, 0)
        # (json.dumps of the builtins: the line as it always was)
        os.pwrite(fd, (json.dumps(msgspec.to_builtins(record)) + "\n").encode(), 0)
        return self

    def _open(self) -> int:
        try:
            return os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise OutputLocked(f"cannot create the lock file {self.lock_file} beside "
                               f"{self.path}: {e.strerror}") from None

    def _check_holder(self, holder: LockHolder | None, flock_works: bool) -> None:
        """Refuse a lock another host may still hold; say when a stale one is taken over."""
        if holder is None:
            return
        if holder.host != _host():
            raise OutputLocked(
                f"{self.path} is locked by {_describe(holder)} (lock {self.lock_file}); this "
                "host cannot tell whether that run still goes on (on NFS, locks may not reach "
                f"across hosts). If it does not, remove {self.lock_file} and rerun")
        pid = holder.pid
        if not flock_works and _pid_alive(pid) and pid != os.getpid():
            raise OutputLocked(f"{self.path} is being written by {_describe(holder)} (lock "
                               f"{self.lock_file}); wait for that run to end, or stop it")
        if self.note is not None:
            gone = "no longer running" if not _pid_alive(pid) else "not holding it any more"
            self.note(f"{self.path}: took over the lock left by {_describe(holder)}, {gone}")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.lock_file)  # first, while held: see the module docstring
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


_holder_decoder = msgspec.json.Decoder(LockHolder)


def _read(fd: int) -> LockHolder | None:
    """Who the lock file says holds it; None when it is empty or unreadable (a torn write)."""
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return None
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        holder = _holder_decoder.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return holder if holder != LockHolder() else None  # `{}`: nobody named


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
