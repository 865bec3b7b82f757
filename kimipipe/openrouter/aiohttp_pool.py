"""The same `post(body, assembler)` as http11.Http11Pool, over aiohttp: the escape hatch.

Http11Pool is our own HTTP/1.1 client, chosen for its CPU cost per streamed event
(bench/README.md). The live OpenRouter cannot be reached from where kimipipe is built and
tested, so if some proxy, load balancer or TLS setup trips the hand-written client, users
run `kp-infer --http-client aiohttp`: a well-kept library carries the bytes, and every
rule above it (the assembler, retries, budgets, routing) stays exactly the same, since the
outcomes are the same objects (CollectedResponse, Stalled, Broken). It costs more CPU per event
(~25 µs against ~15 µs), which more `--workers` make up for.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from .connect import keepalive_socket
from .outcomes import Broken, CollectedResponse, Stalled


def _socket_factory(addr_info):
    family, type_, proto, _, _ = addr_info
    return keepalive_socket(family, type_, proto)


class AiohttpPool:
    """Keep-alive connections through one aiohttp session; streams watched for data stalls."""

    def __init__(self, url: str, headers: dict[str, str], *, idle_timeout: float = 120.0,
                 connect_timeout: float = 30.0):
        self.url = url
        self.headers = {"Accept-Encoding": "identity", **headers}
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[int, list] = {}  # task id -> [time of last data line, task]
        self._watchdog: asyncio.Task | None = None

    async def __aenter__(self) -> AiohttpPool:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300,
                                         socket_factory=_socket_factory, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout,
                                        sock_read=self.idle_timeout)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                              headers=self.headers)
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._watchdog:
            self._watchdog.cancel()
        if self._session:
            await self._session.close()

    async def _watch(self) -> None:
        """One sweep a second for all streams: keep-alive comments are not data."""
        interval = min(1.0, max(0.05, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for entry in list(self._streams.values()):
                if now - entry[0] > self.idle_timeout and not entry[1].done():
                    entry[0] = float("inf")
                    entry[1].cancel("stalled")

    async def post(self, body: bytes, assembler=None):
        accept = "application/json" if assembler is None else "text/event-stream"
        head_received = False
        try:
            async with self._session.post(self.url, data=body, headers={"Accept": accept}) as resp:
                head_received = True
                if resp.status != 200 or assembler is None:
                    return CollectedResponse(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                                      await resp.read())
                return await self._read_events(resp, assembler)
        except asyncio.CancelledError as e:
            if e.args and e.args[0] == "stalled":
                return Stalled(self.idle_timeout)
            raise
        except TimeoutError:  # no bytes at all (or no connection) in time
            return Stalled(self.idle_timeout)
        except aiohttp.ClientPayloadError as e:
            return Broken(f"{type(e).__name__}: {e}", True)
        except (aiohttp.ClientConnectionError, aiohttp.ClientResponseError) as e:
            return Broken(f"{type(e).__name__}: {e}", head_received)

    async def _read_events(self, resp: aiohttp.ClientResponse, assembler):
        task = asyncio.current_task()
        entry = [time.monotonic(), task]
        self._streams[id(task)] = entry
        buffer = b""
        try:
            async for data in resp.content.iter_any():
                buffer += data
                lines = buffer.split(b"\n")
                buffer = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators and `: OPENROUTER PROCESSING` comments
                    entry[0] = time.monotonic()
                    decided = assembler.event(line[5:].strip())
                    if decided is not None:
                        return decided
        finally:
            self._streams.pop(id(task), None)
        return assembler.end()
