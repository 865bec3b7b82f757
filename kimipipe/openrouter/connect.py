"""Opening a connection for `http11.Http11Pool`: DNS, every address tried, TCP keepalive, TLS trust.

- One `getaddrinfo` is shared by the thousand connects of a cold start (`Resolver`); it is
  looked up again after 5 minutes, and at once after a connect failed, so an address that
  moved is found without a restart.
- Every address the lookup gave is tried, Happy Eyeballs style (RFC 8305, simplified):
  families interleaved (IPv6, IPv4, IPv6, ...), the next address started 250 ms after the
  previous one or as soon as it failed, the first to connect wins and the others are
  closed. An address that swallows SYNs costs 250 ms, not the whole connect timeout, and
  the caller's `connect_timeout` bounds all of it.
- Sockets have TCP keepalive on (a connection a NAT dropped becomes an error instead of a
  hang) and Nagle off.
- TLS trusts the system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set (a corporate
  CA), as OpenSSL, curl and httpx read them: the file or directory replaces the system store.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time

HAPPY_EYEBALLS_DELAY = 0.25  # RFC 8305's recommended Connection Attempt Delay
DNS_TTL = 300.0


def keepalive_socket(family: int, type_: int, proto: int) -> socket.socket:
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_NODELAY"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def tls_context() -> ssl.SSLContext:
    """Certificate checks on; SSL_CERT_FILE / SSL_CERT_DIR (when set) instead of the system store."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    if cafile or capath:
        try:
            return ssl.create_default_context(cafile=cafile, capath=capath)
        except (OSError, ssl.SSLError) as e:
            names = " and ".join(f"{k}={v}" for k, v in (("SSL_CERT_FILE", cafile),
                                                          ("SSL_CERT_DIR", capath)) if v)
            raise ValueError(f"cannot load the CA certificates of {names}: {e}") from None
    return ssl.create_default_context()


class Resolver:
    """One shared lookup for HOST:PORT; refreshed after DNS_TTL or when `forget` is called."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.lookups = 0
        self._task: asyncio.Future | None = None
        self._at = 0.0

    async def addresses(self) -> list[tuple]:
        loop = asyncio.get_running_loop()
        if self._task is None or time.monotonic() - self._at > DNS_TTL:
            self._task = asyncio.ensure_future(
                loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
            self._at = time.monotonic()
            self.lookups += 1
        task = self._task
        try:
            return await asyncio.shield(task)
        except OSError:
            if self._task is task:
                self._task = None
            raise

    def forget(self) -> None:
        self._task = None


def interleave(addresses: list[tuple]) -> list[tuple]:
    """RFC 8305 section 4: alternate address families, starting with the first one given."""
    if not addresses:
        return []
    first = addresses[0][0]
    a = [x for x in addresses if x[0] == first]
    b = [x for x in addresses if x[0] != first]
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


async def _sock_connect(loop: asyncio.AbstractEventLoop, sock: socket.socket, address) -> None:
    """loop.sock_connect for an address getaddrinfo already gave: uvloop's own resolves it
    again in its thread pool on every call (~100 µs each, 2000 times on a cold start)."""
    try:
        sock.connect(address)
        return
    except BlockingIOError:
        pass
    fd = sock.fileno()
    writable = loop.create_future()
    loop.add_writer(fd, lambda: writable.done() or writable.set_result(None))
    try:
        await writable
    finally:
        loop.remove_writer(fd)
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, f"connect to {_show(address)} failed: {os.strerror(error)}")


def _show(address: tuple) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def open_socket(addresses: list[tuple], delay: float = HAPPY_EYEBALLS_DELAY) -> socket.socket:
    """A connected non-blocking socket to the first of ADDRESSES (getaddrinfo's tuples) that
    answers; see the module docstring. Raises OSError when every address failed; the
    caller's timeout cancels the attempts still running (their sockets are closed)."""
    loop = asyncio.get_running_loop()

    async def attempt(family, type_, proto, _, address) -> socket.socket:
        sock = keepalive_socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await _sock_connect(loop, sock, address)
        except BaseException:
            sock.close()
            raise
        return sock

    todo = iter(interleave(addresses))
    pending: set[asyncio.Task] = set()
    errors: list[BaseException] = []
    try:
        while True:
            entry = next(todo, None)
            if entry is not None:
                pending.add(loop.create_task(attempt(*entry)))
            if not pending:
                break
            done, pending = await asyncio.wait(pending, timeout=delay if entry is not None else None,
                                               return_when=asyncio.FIRST_COMPLETED)
            winner = None
            for task in done:
                if task.exception() is not None:
                    errors.append(task.exception())
                elif winner is None:
                    winner = task.result()
                else:
                    task.result().close()  # two answered at once: keep one
            if winner is not None:
                return winner
    finally:
        for task in pending:
            task.cancel()
    if not errors:
        raise OSError("the name resolved to no address")
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"all {len(errors)} addresses failed: " + "; ".join(str(e) for e in errors[:4]))
