"""Which HTTP proxy a request goes through, and the CONNECT tunnel, as curl, requests and httpx do.

Chosen once per origin URL (`proxy_for`):
- an explicit proxy (kp-infer's and kp-credits' `--proxy URL`) is used for every request:
  it overrides the environment, NO_PROXY included (as httpx's `proxy=` does);
- else the environment: HTTPS_PROXY for https origins, HTTP_PROXY for http ones, ALL_PROXY
  for both; lower-case names too (they win, as urllib reads them). NO_PROXY sends matching
  hosts direct: a comma-separated list of `*`, host names (matching themselves and their
  subdomains; a leading dot is allowed), IP addresses and CIDR ranges, each with an
  optional `:port`.

A proxy URL is `http://[user:password@]host[:port]` (port 80 when not given, a URL
without a scheme is taken as http://). Only plain HTTP proxies: TLS to the proxy itself
and SOCKS are refused with a clear message. The user and password (percent-decoded) are
sent as `Proxy-Authorization: Basic ...` and never shown: messages name the proxy as
`proxy HOST:PORT`.

An https origin is reached through a tunnel: `CONNECT host:443` to the proxy, then TLS to
the origin inside it (the proxy sees the host name, never the request). An http origin
gets its requests in absolute form (`POST http://host/path`) on the proxy's connection.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import re
import socket
from urllib.parse import unquote, urlsplit


class ProxyError(OSError):
    """The proxy could not be reached, or refused the tunnel (message free of credentials)."""


class Proxy:
    __slots__ = ("host", "port", "authorization")

    def __init__(self, host: str, port: int, authorization: str | None):
        self.host, self.port, self.authorization = host, port, authorization

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"proxy {host}:{self.port}"

    __repr__ = __str__  # never the credentials


def parse_proxy(url: str) -> Proxy:
    """A Proxy from `http://[user:password@]host[:port]`; ValueError (without the password)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"proxy URL {safe_url(url)!r} is not a valid URL") from None
    if parts.scheme.lower() != "http":
        raise ValueError(f"proxy URL {safe_url(url)!r}: only http:// proxies are supported "
                         "(not TLS to the proxy, not SOCKS)")
    if not parts.hostname:
        raise ValueError(f"proxy URL {safe_url(url)!r} has no host")
    authorization = None
    if parts.username is not None or parts.password is not None:
        credentials = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode("utf-8")).decode("ascii")
    return Proxy(parts.hostname, port or 80, authorization)


def safe_url(url: str) -> str:
    """URL with any user:password@ taken out, for messages."""
    return re.sub(r"(?<=://)[^/@]*@", "", url) if "@" in url else url


def proxy_for(url: str, explicit: str | None = None) -> Proxy | None:
    """The proxy for requests to URL (see the module docstring), or None for a direct
    connection; ValueError when the proxy URL that applies is not usable."""
    if explicit:
        return parse_proxy(explicit)
    env = environment_proxies()
    parts = urlsplit(url)
    chosen = env.get(parts.scheme) or env.get("all")
    if not chosen:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if bypassed(parts.hostname or "", port, env.get("no", "")):
        return None
    return parse_proxy(chosen)


def environment_proxies() -> dict[str, str]:
    """{"https": URL, "http": ..., "all": ..., "no": LIST} from the environment, as
    urllib.request.getproxies_environment reads it (lower-case names win over upper-case;
    HTTP_PROXY ignored in a CGI request). Not imported from there: urllib.request pulls
    in http.client and email, ~10 MB and ~0.1 s of every start."""
    found: dict[str, str] = {}
    for lower_wins in (False, True):
        for name, value in os.environ.items():
            key = name.lower()
            if key.endswith("_proxy") and (name == key) == lower_wins:
                if value:
                    found[key[:-6]] = value
                elif lower_wins:
                    found.pop(key[:-6], None)
    if "REQUEST_METHOD" in os.environ and "HTTP_PROXY" in os.environ and \
            "http_proxy" not in os.environ:
        found.pop("http", None)
    return found


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether NO_PROXY sends HOST:PORT direct."""
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy.replace(" ", "").lower().split(","):
        if not entry:
            continue
        if entry == "*":
            return True
        if entry.startswith("["):  # [v6] or [v6]:port
            name, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else None
        elif entry.count(":") == 1:  # host:port (a bare IPv6 address has more colons)
            name, entry_port = entry.split(":")
        else:
            name, entry_port = entry, None
        if entry_port is not None and (not entry_port.isdigit() or int(entry_port) != port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


async def open_tunnel(sock: socket.socket, proxy: Proxy, host: str, port: int) -> None:
    """CONNECT HOST:PORT through PROXY on the connected non-blocking SOCK; ProxyError unless 2xx."""
    loop = asyncio.get_running_loop()
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if proxy.authorization:
        request += f"Proxy-Authorization: {proxy.authorization}\r\n"
    await loop.sock_sendall(sock, (request + "\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise ProxyError(f"{proxy} closed the connection before answering CONNECT {target}")
        answer += data
        if len(answer) > 64 * 1024:
            raise ProxyError(f"{proxy} answered CONNECT with more than 64 KiB of head")
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    match = re.fullmatch(r"HTTP/1\.[01] (\d{3})(?: (.*))?", status_line)
    if not match:
        raise ProxyError(f"{proxy} answered CONNECT with {status_line[:80]!r}")
    status = int(match.group(1))
    if not 200 <= status < 300:
        hint = ""
        if status == 407:
            hint = (" (check the user and password in the proxy URL)" if proxy.authorization
                    else " (the proxy wants a user and password: http://USER:PASSWORD@HOST:PORT)")
        raise ProxyError(f"{proxy} refused the tunnel to {target}: {status} "
                         f"{(match.group(2) or '').strip()}{hint}")
    if not answer.endswith(b"\r\n\r\n") or answer.count(b"\r\n\r\n") > 1:
        raise ProxyError(f"{proxy} sent bytes after its CONNECT answer")


def scrub(text: str, *proxy_urls: str | None) -> str:
    """TEXT with every `user:password@` in a URL taken out, and the passwords of PROXY_URLS
    and of the environment's proxy variables replaced by ***: for messages of libraries
    (aiohttp, httpx) that may print the proxy they were given."""
    text = re.sub(r"(?<=://)[^/@\s'\"]*@", "", text)
    urls = [u for u in proxy_urls if u] + list(environment_proxies().values())
    for url in urls:
        try:
            password = urlsplit(url if "://" in url else "http://" + url).password
        except ValueError:
            continue
        for secret in {password, unquote(password or "")}:
            if secret and len(secret) >= 3:
                text = text.replace(secret, "***")
    return text
