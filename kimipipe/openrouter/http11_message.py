"""The parts of an HTTP/1.1 message around llhttp's framing, for `http11.py`.

- `request_head`: the request line and header fields we send, each checked: a name must
  be a token and a value free of CR, LF and other control characters (RFC 9110 5.5), so a
  line break in a value (an API key file with two lines) cannot end the head early and
  smuggle what follows; values must be Latin-1 text.
- `host_header`: an IPv6 literal in brackets, the port only when not the scheme's default
  (RFC 9112 3.2, RFC 3986 3.2.2).
- `unfold`: obs-fold (a header value continued on a line that starts with whitespace) is
  replaced by a space, as RFC 9112 5.2 asks of a user agent; llhttp alone rejects it.
- `Deflate`: Content-Encoding deflate, zlib-wrapped or raw.
"""

from __future__ import annotations

import re
import zlib


class ProtocolError(Exception):
    """The response breaks HTTP/1.1 or one of our limits: the connection cannot be reused."""


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but HTAB
_OBS_FOLD = re.compile(rb"[ \t]*\r\n[ \t]+")


def unfold(head: bytes) -> bytes:
    """RFC 9112 5.2: a user agent replaces each obs-fold (CRLF then whitespace, a header
    value continued on the next line) with a space; llhttp would reject it."""
    first = head.find(b"\r\n")
    if head[first + 2:first + 3] in (b" ", b"\t"):
        raise ProtocolError("whitespace before the first header line")
    return head[:first] + _OBS_FOLD.sub(b" ", head[first:])


def host_header(host: str, port: int, default_port: int) -> str:
    """RFC 9112 3.2 / RFC 3986 3.2.2: an IPv6 literal in brackets, the port only when not the default."""
    name = f"[{host}]" if ":" in host else host
    return name if port == default_port else f"{name}:{port}"


def request_head(target: str, headers: dict[str, str], method: str = "POST") -> str:
    """`METHOD TARGET HTTP/1.1` and HEADERS, each checked: a line break in a value (e.g. an
    API key file with two lines) would end the head early and smuggle what follows."""
    if not target or any(c in target for c in " \t\r\n\x00"):
        raise ValueError("the request path holds whitespace or a control character")
    lines = [f"{method} {target} HTTP/1.1\r\n"]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not an HTTP token")
        if _BAD_VALUE.search(value):
            raise ValueError(f"header {name}: its value holds a line break or control character")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"header {name}: its value is not Latin-1 text") from None
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


class Deflate:
    """Content-Encoding: deflate is meant to be zlib-wrapped (RFC 9110 8.4.1.2), but some
    servers send raw deflate; the first two bytes tell which (as browsers and curl do)."""

    __slots__ = ("inner", "start")

    def __init__(self):
        self.inner = None
        self.start = b""

    @property
    def eof(self) -> bool:
        return self.inner is not None and self.inner.eof

    def decompress(self, data: bytes) -> bytes:
        if self.inner is None:
            data = self.start + data
            if len(data) < 2:
                self.start = data
                return b""
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self.inner = zlib.decompressobj(15 if zlib_header else -15)
        return self.inner.decompress(data)
