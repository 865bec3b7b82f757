"""An HTTP/1.1 client and connection pool for completions, without a coroutine per TCP segment.

Why not aiohttp for streams: a live stream's events arrive a few at a time, each write in
its own TCP segment. Through aiohttp every segment costs its C parser call, a StreamReader
feed, a read-timeout timer reschedule and a wake-up of the reading task (an async-for step),
before any of our code runs: ~17-27 µs of CPU per SSE event at 1000 streams for a plain
aiohttp client (bench/README.md), which caps one process at ~1000 live 40-event/s streams. Here the bytes
are taken straight from the socket by an `asyncio.Protocol` and handed to llhttp (the
parser of Node.js and aiohttp, through `httptools`), which does the HTTP/1.1 framing: status
line, headers, chunked transfer, Content-Length, bodies that end with the connection,
trailers, 1xx heads; it rejects what RFC 9112 forbids (sizes that are not plain digits,
Content-Length together with chunked, control characters in headers). Its body callback
splits SSE lines; the `data:` payloads of one read (however many HTTP chunks it held) go to
the caller's assembler in one synchronous call, and one future per request is resolved
when the answer is decided (or the stream ends, stalls or breaks). Plain (non-streamed) requests use the same connections: their body is collected
whole, which at 2000 in flight costs less CPU than aiohttp (bench/README.md).

    pool = Http11Pool(url, headers, idle_timeout=120, connect_timeout=30)
    async with pool:
        outcome = await pool.post(body, assembler)   # streamed
        outcome = await pool.post(body)              # plain: CollectedResponse with the whole body

`assembler` is any object with `events(payloads: list[bytes]) -> result | None` (the
`data:` lines' payloads of one read, stripped, in order; a non-None result decides the
request, e.g. `[DONE]` or an error chunk), `end() -> result` (the body ended without a
decision) and `salvage() -> result | None` (the connection broke mid-stream: a result
when what came is whole, as an answer whose finish and usage came before `[DONE]` is).
An assembler whose `abandon` is true once it decided has its connection closed rather
than read to its end, and `pool.abandon(decide)` does the same to the streams in flight
that `decide(assembler)` gives an outcome for: closing the connection is how a client
cancels a generation (kimipipe: a quarantined provider's streams, openrouter/client.py).
An assembler with a `lines(lines: list[bytes])` method is also handed every whole line of
each read (comments and blank lines too): a tap for a caller that must see the stream's
shape, not only its data (kimipipe's --preflight, openrouter/probe.py). `post` returns that result, or
one of the outcome objects of `outcomes.py` (CollectedResponse, Stalled, Broken), which
the caller maps to its own error kinds.

Limits: a response head of at most 64 KiB, an error body kept to its first MiB, a plain
body of at most 256 MiB, an SSE line of at most 16 MiB. A response that breaks HTTP/1.1 is
`Broken` and its connection closed.

What RFC 9112 asks of a client, beyond llhttp: obs-fold header lines are unfolded; a
Content-Encoding (gzip, zlib or raw deflate) must reach its end (a truncated body is
Broken); a 200 to a streamed request whose Content-Type is not text/event-stream is read
whole as a CollectedResponse (a JSON error keeps its message); Host brackets an IPv6
literal; header names and values we send are checked (no CR, LF or other control
characters).

kimipipe has two HTTP stacks, each for a reason: this one for the data plane (completions:
thousands in flight, per-chunk CPU is what limits the process; and what goes with them:
`get` for a generation's cost and a server's models, --preflight's requests through a tap),
and a general client for the control plane (balance, key, endpoints: a few GETs per run,
where a well-kept library matters and CPU per request does not; httpx,
openrouter/account.py, for kp-infer and kp-credits alike). The aiohttp escape hatch (`--http-client
aiohttp`) is gone: it was kept in case a proxy or load balancer tripped the hand-written
parser, and the parser is now llhttp, the one aiohttp itself uses, while aiohttp costs
several times the CPU per event (docs/performance.md) and would need its own proxy handling.

Connections are reused (HTTP/1.1 keep-alive) once a response has been read to its end. A
request is sent once: a reused connection that closes before the first byte of the answer
is `Broken(stale=True)`, for the caller to send again as a new, counted attempt. How a
connection is opened (DNS, every address tried, TCP keepalive, TLS trust) is `connect.py`;
which proxy it goes through (HTTPS_PROXY, NO_PROXY, `proxy=`) and the CONNECT tunnel,
`proxy.py`; the request head and the message details around llhttp, `http11_message.py`.

Over 400 lines: the Protocol and the pool that owns its connections (idle list, active
set, the watchdog that reads each connection's clock) are one piece, read together.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from urllib.parse import urlsplit

import httptools

from .connect import Resolver, open_socket, tls_context
from .http11_message import Deflate, ProtocolError, host_header, request_head, unfold
from .outcomes import Broken, CollectedResponse, Stalled
from .proxy import ProxyError, open_tunnel, proxy_for

_MAX_HEAD = 64 * 1024
_MAX_EVENT_LINE = 16 << 20  # one SSE line; a 200 that never sends a newline is not a stream
_MAX_ERROR_BODY = 1 << 20
_MAX_PLAIN_BODY = 256 << 20
_POOL_IDLE_SECONDS = 30.0  # below the usual server keep-alive (aiohttp 75 s, nginx 75 s)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time (see the module docstring).

    llhttp (httptools) does the framing and calls back into the `on_*` methods below; the
    response head is gathered here first (to bound its size) and fed to it whole.
    """

    def __init__(self, pool: Http11Pool):
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.busy = False             # a request is out and its response not read to its end
        self.future: asyncio.Future | None = None
        self.assembler = None
        self.tap = None               # the assembler's `lines`, when it has one (module docstring)
        self.decided = True           # the request's outcome is known (future resolved)
        self.got_bytes = False
        self.any_byte_counts = False  # plain: any byte is progress; streamed: data lines only
        self.last_data = 0.0
        self.head = b""
        self.head_done = False        # the final (non-1xx) head has been parsed
        self.informational = False
        self.complete = False         # llhttp saw the end of the message
        self.until_close = False
        self.keep_alive = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.sse = b""                # the start of an SSE line not yet ended
        self.payloads: list[bytes] = []  # the `data:` payloads of this read, not yet delivered
        self.collected: list[bytes] | None = None  # error and plain bodies
        self.collected_size = 0
        self.collect_limit = 0
        self.inflate = None

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.busy = False
        self.pool._forget(self)
        if self.decided:
            return
        if self.head_done and self.until_close:
            try:
                self._body_end()  # the close ends a body that had no length
            except ProtocolError as e:
                self._resolve(Broken(f"bad HTTP response: {e}", cut=self.status == 200))
        elif not self.head_done:
            stale = self.reused and not self.got_bytes
            what = "the kept-alive connection" if stale else "the connection"
            message = f"server closed {what} before answering"
            if exc is not None:
                message += f" ({_describe(exc, '')})"
            self._resolve(Broken(message, cut=False, stale=stale))
        else:
            if self.collected is None and self.payloads:
                self._deliver()  # (data_received delivers each read: none are left, as a rule)
            if not self.decided and self.collected is None and self.status == 200 and (
                    answer := self.assembler.salvage()) is not None:
                # cut between the answer's usage and `[DONE]`: whole and billed, so kept
                # (dropping it would pay for the same prompt again, unrecorded)
                self._resolve(answer)
                return
            self._resolve(Broken(_describe(exc, "stream ended early"), cut=self.status == 200))

    def eof_received(self):
        return False  # close our side too; connection_lost finishes the request

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: the connection's state is unknown
            self.abort()
            return
        self.got_bytes = True
        if self.any_byte_counts:
            self.last_data = time.monotonic()
        try:
            if not self.head_done:
                data = self._read_head(data)
            if data:
                if self.complete:
                    raise ProtocolError("bytes after the end of the response")
                self.parser.feed_data(data)
            if self.payloads and not self.decided:
                self._deliver()
        except httptools.HttpParserCallbackError as e:
            error = e.__context__
            if not isinstance(error, ProtocolError):  # a bug in our callbacks: let it show
                if not self.decided:
                    self.decided = True
                    if not self.future.done():
                        self.future.set_exception(error or e)
                self.abort()
                return
            self._fail(Broken(f"bad HTTP response: {error}", cut=self.head_done and self.status == 200))
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, ProtocolError) as e:
            self._fail(Broken(f"bad HTTP response: {e}", cut=self.head_done and self.status == 200))
            return
        if self.complete:
            self._message_end()

    # -- requests ----------------------------------------------------------------------------
    def start(self, request: bytes, future: asyncio.Future, assembler) -> None:
        self.future = future
        self.assembler = assembler
        self.tap = getattr(assembler, "lines", None)
        self.decided = False
        self.busy = True
        self.got_bytes = self.head_done = self.informational = self.complete = False
        self.until_close = False
        self.any_byte_counts = assembler is None
        self.head = self.sse = b""
        self.payloads = []
        self.status = 0
        self.headers = {}
        self.collected = None
        self.inflate = None
        self.last_data = time.monotonic()
        self.transport.write(request)

    def _resolve(self, outcome) -> None:
        self.decided = True
        future = self.future
        if future is not None and not future.done():
            future.set_result(outcome)

    def _fail(self, outcome) -> None:
        """Resolve (if still open) and drop the connection: its framing can't be trusted."""
        if not self.decided:
            self._resolve(outcome)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.busy = False
        if self.transport is not None:
            self.transport.abort()

    def _message_end(self) -> None:
        """The response was read to its end: the connection goes back to the pool or closes."""
        self.busy = False
        self.future = self.assembler = self.collected = None
        if self.closed:
            return
        if self.keep_alive:
            self.pool._release(self)
        else:
            self.abort()

    # -- the response head -------------------------------------------------------------------
    def _read_head(self, data: bytes) -> bytes:
        """Gather the head (bounded by _MAX_HEAD) and feed it to llhttp whole; return the
        bytes after it (b"" while it is incomplete). 1xx heads are skipped."""
        buf = self.head + data if self.head else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0 or end > _MAX_HEAD:
                if len(buf) > _MAX_HEAD:
                    raise ProtocolError("response head too large")
                self.head = buf
                return b""
            self.head = b""
            head, buf = buf[:end + 4], buf[end + 4:]
            if b"\r\n " in head or b"\r\n\t" in head:
                head = unfold(head)
            self.parser.feed_data(head)
            if self.head_done or self.complete:
                return buf

    # -- llhttp callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            raise ProtocolError("bytes after the end of the response")
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a trailer field: nothing here uses them
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip()
        headers = self.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            self.informational = True  # 100 Continue, 103 Early Hints: the real head follows
            return
        self.head_done = True
        self.status = status
        self.last_data = time.monotonic()
        headers = self.headers
        transfer = headers.get("transfer-encoding")
        if transfer is not None and transfer.lower() != "chunked":
            raise ProtocolError(f"unsupported transfer-encoding {transfer!r}")
        self.until_close = transfer is None and "content-length" not in headers \
            and status not in (204, 304)
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip"):
            self.inflate = zlib.decompressobj(31)
        elif encoding == "deflate":
            self.inflate = Deflate()
        elif encoding not in ("identity", ""):
            raise ProtocolError(f"unsupported content-encoding {encoding!r}")
        media_type = headers.get("content-type", "text/event-stream").split(";", 1)[0]
        if status != 200 or self.assembler is None or media_type.strip().lower() != "text/event-stream":
            # An error, a plain answer, or a 200 to a stream request that is not a stream
            # (a JSON error body, or a whole answer): read whole, so its message is kept.
            self.any_byte_counts = True
            self.collected = []
            self.collected_size = 0
            self.collect_limit = _MAX_PLAIN_BODY if status == 200 else _MAX_ERROR_BODY

    def on_body(self, data: bytes) -> None:
        if self.inflate is not None:
            try:
                data = self.inflate.decompress(data)
            except zlib.error as e:
                raise ProtocolError(f"bad compressed body: {e}") from None
        if self.collected is not None:
            self.collected_size += len(data)
            if self.collected_size > self.collect_limit:
                if self.status == 200:
                    raise ProtocolError("body too large")
                return  # an error body: its first megabyte says enough
            self.collected.append(data)
            return
        if self.decided:
            return  # the answer is known (e.g. after [DONE]): read on only to reuse the connection
        if self.sse:
            data = self.sse + data
        lines = data.split(b"\n")
        rest = lines.pop()  # after the last newline: a line not yet ended ("" when none)
        if len(rest) > _MAX_EVENT_LINE:
            raise ProtocolError("event stream line too long")
        self.sse = rest
        if self.tap is not None:
            self.tap(lines)
        payloads = self.payloads
        for line in lines:
            if line[:5] == b"data:":
                payloads.append(line[5:].strip())

    def _deliver(self) -> None:
        """The `data:` payloads of what this read brought (every HTTP chunk of it), to the
        assembler in one call; the stall clock is read once for them all."""
        payloads = self.payloads
        self.payloads = []
        self.last_data = time.monotonic()
        outcome = self.assembler.events(payloads)
        if outcome is not None:
            self._resolve(outcome)
            if getattr(self.assembler, "abandon", False):
                self.abort()  # the rest is not wanted: closing is what cancels it upstream

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._body_end()

    def _body_end(self) -> None:
        if self.payloads and not self.decided:
            self._deliver()
        if self.inflate is not None and not self.inflate.eof:
            raise ProtocolError("the compressed body ends early")
        if not self.decided:
            if self.collected is not None:
                self._resolve(CollectedResponse(self.status, self.headers, b"".join(self.collected)))
            else:
                self._resolve(self.assembler.end())


def _describe(exc: BaseException | None, default: str) -> str:
    return f"{type(exc).__name__}: {exc}" if exc is not None else default


class Http11Pool:
    """Keep-alive HTTP/1.1 connections to one URL, for streamed and plain POSTs (module docstring)."""

    def __init__(self, url: str, headers: dict[str, str], *, idle_timeout: float = 120.0,
                 connect_timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None,
                 proxy: str | None = None):
        """PROXY: an http:// proxy URL for every request; None: the environment's
        (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY; see proxy.py)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme: {url}")
        self.host = parts.hostname or "localhost"
        default_port = 443 if parts.scheme == "https" else 80
        self.port = parts.port or default_port
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl_context or tls_context()
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = host_header(self.host, self.port, default_port)
        fixed = {"Host": host, "Accept-Encoding": "identity", "Connection": "keep-alive",
                 "User-Agent": "kimipipe",
                 **{k: v for k, v in headers.items()
                    if k.lower() not in ("content-length", "accept", "proxy-authorization")}}
        self.proxy = proxy_for(url, proxy)
        self.tunnel = self.proxy is not None and self.ssl is not None
        self._origin = ""  # what goes before a path in a request's target
        if self.proxy is not None and not self.tunnel:
            # an http origin through a proxy: absolute-form requests on the proxy's connection
            self._origin = f"http://{host}"
            target = self._origin + target
            if self.proxy.authorization:
                fixed["Proxy-Authorization"] = self.proxy.authorization
        head = request_head(target, fixed)
        self._fixed = fixed
        self._stream_head = (head + "Accept: text/event-stream\r\n").encode("latin-1")
        self._plain_head = (head + "Accept: application/json\r\n").encode("latin-1")
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self._resolver = Resolver(self.proxy.host, self.proxy.port) if self.proxy else \
            Resolver(self.host, self.port)
        self._idle: list[_Connection] = []
        self._active: set[_Connection] = set()
        self._watchdog: asyncio.Task | None = None

    async def __aenter__(self) -> Http11Pool:
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._watchdog:
            self._watchdog.cancel()
        for conn in [*self._idle, *self._active]:
            conn.abort()
        self._idle.clear()
        self._active.clear()

    @property
    def in_flight(self) -> int:
        """Requests out on this pool's connections now (sent, their response not yet read)."""
        return len(self._active)

    def abandon(self, decide) -> int:
        """Close the streams in flight that DECIDE (called with each one's assembler)
        gives an outcome for: the outcome is their request's, and their connection is
        closed (not read to its end). How many were closed."""
        closed = 0
        for conn in list(self._active):
            if conn.decided or conn.assembler is None or conn.collected is not None:
                continue
            outcome = decide(conn.assembler)
            if outcome is not None:
                conn._resolve(outcome)
                conn.abort()
                closed += 1
        return closed

    async def post(self, body: bytes, assembler=None):
        """One request, one outcome: never sent again here (see outcomes.Broken.stale)."""
        head = self._plain_head if assembler is None else self._stream_head
        return await self._send(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body,
                                assembler)

    async def get(self, path: str):
        """GET PATH (with its query) on this pool's host, over the same connections: a
        CollectedResponse with the whole body, or Stalled/Broken (a control call beside
        the completions: a generation's cost, a server's models)."""
        head = request_head(self._origin + path, self._fixed, method="GET")
        return await self._send((head + "Accept: application/json\r\n\r\n").encode("latin-1"), None)

    async def _send(self, request: bytes, assembler):
        conn = await self._acquire()
        future = asyncio.get_running_loop().create_future()
        conn.start(request, future, assembler)
        try:
            return await future
        except asyncio.CancelledError:
            conn.abort()
            raise

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > _POOL_IDLE_SECONDS:
                conn.abort()
                continue
            conn.reused = True
            self._active.add(conn)
            return conn
        conn = await self._connect()
        self._active.add(conn)
        return conn

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                try:
                    sock = await open_socket(await self._resolver.addresses())
                except OSError as e:
                    if self.proxy is None:
                        raise
                    raise ProxyError(f"cannot reach {self.proxy}: {e}") from None
                try:
                    if self.tunnel:
                        await open_tunnel(sock, self.proxy, self.host, self.port)
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self), sock=sock, ssl=self.ssl,
                        server_hostname=self.host if self.ssl else None)
                except BaseException:
                    sock.close()
                    raise
        except (OSError, TimeoutError):
            self._resolver.forget()  # look the name up again: the service may have moved
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        self._active.discard(conn)
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._active.discard(conn)

    async def _watch(self) -> None:
        """One sweep for all streams instead of a timer per chunk: stalls, and old idle sockets."""
        interval = min(1.0, max(0.05, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._active):
                if now - conn.last_data > self.idle_timeout:
                    conn._fail(Stalled(self.idle_timeout))
                    self._active.discard(conn)
            if self._idle and now - self._idle[0].idle_since > _POOL_IDLE_SECONDS:
                keep = []
                for conn in self._idle:
                    if now - conn.idle_since > _POOL_IDLE_SECONDS:
                        conn.abort()
                    else:
                        keep.append(conn)
                self._idle = keep
