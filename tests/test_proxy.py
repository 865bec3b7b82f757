"""Proxies and custom CAs, through real programs: kp-infer and kp-credits as a user runs them.

The path of a request here: the command -> pproxy (a real HTTP proxy from PyPI, run as a
subprocess) -> a TLS terminator on loopback whose certificate comes from a throw-away CA
(trustme) -> the plain-HTTP stand-in. The command trusts that CA only through
SSL_CERT_FILE / SSL_CERT_DIR, as a user behind a corporate proxy would set them.

That every connection went through the proxy is checked by counting: pproxy logs each
connection it opens (`-v`), the TLS terminator counts the connections it accepted, and the
two must agree (a direct connection would reach the terminator without a log line).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import kp, read_jsonl, write_jsonl

trustme = pytest.importorskip("trustme")
pytest.importorskip("pproxy")

USER, PASSWORD = "kp-user", "Pr0xy-pa55word-%41"  # %41 is "A": the URL is percent-decoded
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")


@contextlib.contextmanager
def dead_port():
    """A loopback port nobody listens on, for as long as the block runs: a socket bound to
    it and not listening, so a connection is refused (RST) and no other process can take
    the port meanwhile (a port bound, closed and named later could be anyone's by then)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def proxy_env(**values: str) -> dict[str, str]:
    """The proxy variables, upper and lower case, all set (empty = unset, as urllib reads them)."""
    env = {}
    for name in PROXY_VARS:
        value = values.get(name.split("_")[0].lower(), "")
        env[name] = env[name.lower()] = value
    return env


class PProxy:
    """`pproxy -l http://127.0.0.1:0[#user:password] -v --auth 0` (auth asked on every
    connection) as a subprocess; `targets()` lists the HOST:PORT of each connection it made."""

    started = 0  # (names its files: a test may start several)

    def __init__(self, tmp: Path, auth: bool = False):
        # pproxy listens on port 0 (the kernel picks a free one) and writes the port it got
        # to a file once bound: no port chosen here and bound again there, which another
        # process could take in between
        listen = "http://127.0.0.1:0" + (f"#{USER}:Pr0xy-pa55word-A" if auth else "")
        PProxy.started += 1
        self.log = tmp / f"pproxy-{PProxy.started}.log"
        port_file = tmp / f"pproxy-{PProxy.started}.port"
        # pproxy installs uvloop when it can, then calls asyncio.get_event_loop(), which
        # uvloop's policy refuses: run it on the standard loop
        code = ("import asyncio, os, sys; sys.modules['uvloop'] = None\n"
                "port_file = sys.argv[1]\n"
                "start = asyncio.start_server\n"
                "async def bound(*args, **kwargs):\n"
                "    server = await start(*args, **kwargs)\n"
                "    with open(port_file + '.tmp', 'w') as f:\n"
                "        f.write(str(server.sockets[0].getsockname()[1]))\n"
                "    os.replace(port_file + '.tmp', port_file)\n"
                "    return server\n"
                "asyncio.start_server = bound\n"
                "from pproxy.server import main; sys.argv[0:2] = ['pproxy']; main()")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-u", "-c", code, str(port_file), "-l",
                                          listen, "-v", "--auth", "0"],
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "pproxy did not start"
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def targets(self) -> list[str]:
        return [line.split(" -> ")[1].strip() for line in self.log.read_text().splitlines()
                if " -> " in line]

    def refusals(self) -> int:
        return self.log.read_text().count("Unauthorized")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class TLSTerminator:
    """https://localhost:PORT in front of a plain-HTTP server on 127.0.0.1:TARGET, in a
    thread of the test process; counts the connections it accepted."""

    def __init__(self, target_port: int, context: ssl.SSLContext):
        self.target_port, self.context = target_port, context
        self.connections = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        await self.stopped.wait()
        server.close()

    async def _relay(self, reader, writer) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def __enter__(self) -> TLSTerminator:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.thread.join(10)


@pytest.fixture
def ca(tmp_path):
    authority = trustme.CA()
    pem = tmp_path / "corporate-ca.pem"
    authority.cert_pem.write_to_path(str(pem))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return pem, context


@pytest.fixture
def proxies(tmp_path):
    started = []

    def start(auth: bool = False) -> PProxy:
        started.append(PProxy(tmp_path, auth))
        return started[-1]

    yield start
    for p in started:
        p.stop()


def prompts(tmp_path, n=6):
    return write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"p{i}", "dataset": "t", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(n)])


def infer(base_url, api_key, tmp_path, *args, env):
    out = tmp_path / f"r{time.monotonic_ns()}.jsonl"
    r = kp("infer", prompts(tmp_path), "-o", out, "--base-url", base_url, "--backoff-base", "0.01",
           "--concurrency", "3", *args, env={"OPENROUTER_API_KEY": api_key, **env})
    return r, out


# -- kp-infer ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["--stream", "--no-stream"], ids=["stream", "plain"])
def test_kp_infer_through_https_proxy_to_a_tls_origin_with_a_corporate_ca(
        standin, proxies, ca, tmp_path, mode):
    pem, context = ca
    server = standin(request_log=True)
    proxy = proxies()
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        base_url = f"https://localhost:{tls.port}/api/v1"
        env = {**proxy_env(https=proxy.url()), "SSL_CERT_FILE": str(pem)}
        r, out = infer(base_url, server.api_key, tmp_path, mode, env=env)
        assert r.code == 0, r.stderr
        assert "endpoints table" not in r.stderr  # the control plane got through as well
        assert sorted(rec["id"] for rec in read_jsonl(out)) == [f"p{i}" for i in range(6)]
        assert len(server.requests()) == 6
        targets = proxy.targets()
        assert targets and set(targets) == {f"localhost:{tls.port}"}
        assert len(targets) == tls.connections  # every connection went through the proxy


def test_kp_infer_without_the_ca_refuses_the_origin(standin, proxies, ca, tmp_path):
    _, context = ca
    server = standin(request_log=True)
    proxy = proxies()
    failures = tmp_path / "failures.jsonl"
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        r, out = infer(f"https://localhost:{tls.port}/api/v1", server.api_key, tmp_path,
                       "--max-attempts", "1", "--failures", failures,
                       env={**proxy_env(https=proxy.url()), "SSL_CERT_FILE": "", "SSL_CERT_DIR": ""})
    assert r.code == 4, r.stderr  # every prompt failed: the certificate is not trusted
    assert read_jsonl(out) == [] and server.requests() == []
    messages = [f["message"] for f in read_jsonl(failures)]
    assert len(messages) == 6 and all("certificate" in m.lower() for m in messages), messages


def test_ssl_cert_dir_is_honoured(standin, ca, tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl (for `openssl rehash`) not installed")
    pem, context = ca
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(pem, certs / "corporate-ca.pem")
    subprocess.run(["openssl", "rehash", str(certs)], check=True, capture_output=True)
    server = standin()
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        r, out = infer(f"https://localhost:{tls.port}/api/v1", server.api_key, tmp_path, env={**proxy_env(), "SSL_CERT_FILE": "", "SSL_CERT_DIR": str(certs)})
    assert r.code == 0, r.stderr
    assert "endpoints table" not in r.stderr
    assert len(read_jsonl(out)) == 6


def test_an_unloadable_ssl_cert_file_is_exit_2_before_any_request(standin, ca, tmp_path):
    """README (proxies and CAs): an SSL_CERT_FILE that cannot be loaded (here: not a PEM)
    stops kp-infer with exit 2 and one line naming it, before any request: not the
    endpoints table, not a completion; nothing is written."""
    _, context = ca
    bad = tmp_path / "corporate-ca.pem"
    bad.write_text("this is not a certificate\n")
    server = standin(request_log=True)
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        r, out = infer(f"https://localhost:{tls.port}/api/v1", server.api_key, tmp_path,
                       env={**proxy_env(), "SSL_CERT_FILE": str(bad)})
        connections = tls.connections
    assert r.code == 2, r.stderr
    assert f"SSL_CERT_FILE={bad}" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert connections == 0 and server.requests() == []
    assert server.stats()["endpoint_requests"] == {}
    assert not out.exists() or read_jsonl(out) == []


def test_kp_infer_plain_http_origin_through_http_proxy(standin, proxies, tmp_path):
    server = standin(request_log=True)
    proxy = proxies()
    port = int(server.base_url.split(":")[2].split("/")[0])
    r, out = infer(server.base_url, server.api_key, tmp_path, "--no-stream", env=proxy_env(http=proxy.url()))
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 6 and len(server.requests()) == 6
    assert f"127.0.0.1:{port}" in proxy.targets()


def test_no_proxy_sends_the_origin_direct(standin, tmp_path):
    server = standin(request_log=True)
    with dead_port() as port:  # nothing listens: only a bypass can work
        dead_proxy = f"http://127.0.0.1:{port}"
        for no_proxy in ("127.0.0.1", "localhost,127.0.0.0/8", "*", f".example.com,127.0.0.1:{server.base_url.split(':')[2].split('/')[0]}"):
            r, out = infer(server.base_url, server.api_key, tmp_path, env=proxy_env(http=dead_proxy, https=dead_proxy, no=no_proxy))
            assert r.code == 0, (no_proxy, r.stderr)
            assert len(read_jsonl(out)) == 6
        # and without the bypass the dead proxy is used, and named (as a proxy) in the failures
        failures = tmp_path / "failures.jsonl"
        r, out = infer(server.base_url, server.api_key, tmp_path, "--max-attempts", "1",
                       "--failures", failures, env=proxy_env(http=dead_proxy))
    assert r.code == 4 and read_jsonl(out) == []
    assert all("cannot reach proxy 127.0.0.1:" in f["message"] for f in read_jsonl(failures))


def test_proxy_option_overrides_the_environment(standin, proxies, tmp_path):
    server = standin(request_log=True)
    proxy = proxies()
    with dead_port() as port:
        dead = f"http://127.0.0.1:{port}"
        r, out = infer(server.base_url, server.api_key, tmp_path, "--proxy", proxy.url(),
                       env=proxy_env(http=dead, https=dead, no="*"))
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 6 and proxy.targets()


def test_proxy_credentials_are_sent_and_never_printed(standin, proxies, ca, tmp_path):
    pem, context = ca
    server = standin(request_log=True)
    proxy = proxies(auth=True)
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        base_url = f"https://localhost:{tls.port}/api/v1"
        env = {**proxy_env(), "SSL_CERT_FILE": str(pem)}
        # right credentials, in --proxy
        r, out = infer(base_url, server.api_key, tmp_path, "--proxy", proxy.url(USER, PASSWORD), env=env)
        assert r.code == 0, r.stderr
        assert "endpoints table" not in r.stderr and PASSWORD not in r.stderr
        assert len(read_jsonl(out)) == 6 and proxy.refusals() == 0
        # the same credentials in HTTPS_PROXY
        r, out = infer(base_url, server.api_key, tmp_path, env={**env, **proxy_env(https=proxy.url(USER, PASSWORD))})
        assert r.code == 0, r.stderr
        assert "endpoints table" not in r.stderr and PASSWORD not in r.stderr
        # a wrong password: refused (407), said so, the password shown nowhere
        failures, summary = tmp_path / "failures.jsonl", tmp_path / "summary.json"
        wrong = "Wr0ng-pa55word"
        r, out = infer(base_url, server.api_key, tmp_path, "--max-attempts", "1",
                       "--failures", failures, "--summary-json", summary,
                       "--proxy", proxy.url(USER, wrong), env=env)
        assert r.code == 4 and read_jsonl(out) == [] and proxy.refusals() > 0
        messages = [f["message"] for f in read_jsonl(failures)]
        assert messages and all("407" in m and "proxy 127.0.0.1:" in m for m in messages)
        assert json.loads(summary.read_text())["retries"]["proxy"] == 6
        for text in (r.stderr, failures.read_text(), summary.read_text()):
            assert wrong not in text and PASSWORD not in text and "Pr0xy-pa55word-A" not in text
        assert server.requests() != []  # only from the runs that had the right password


def test_bad_proxy_urls_are_usage_errors(standin, tmp_path):
    server = standin()
    for url, what in (("socks5://u:hidden-pw@127.0.0.1:1080", "only http://"),
                      ("https://u:hidden-pw@127.0.0.1:3128", "only http://"),
                      ("http://u:hidden-pw@127.0.0.1:notaport", "not a valid URL")):
        r, _ = infer(server.base_url, server.api_key, tmp_path, "--proxy", url, env=proxy_env())
        assert r.code == 2 and what in r.stderr and "hidden-pw" not in r.stderr, r.stderr
        r, _ = infer(server.base_url, server.api_key, tmp_path, env=proxy_env(http=url))
        assert r.code == 2 and what in r.stderr and "hidden-pw" not in r.stderr, r.stderr


# -- kp-credits ----------------------------------------------------------------------------------

def credits(base_url, api_key, *args, env):
    return kp("credits", "--json", "--base-url", base_url, *args,
              env={"OPENROUTER_API_KEY": api_key, **env})


def test_kp_credits_through_the_proxy_with_a_corporate_ca(standin, proxies, ca):
    pem, context = ca
    server = standin(balance=42)
    open_proxy, auth_proxy = proxies(), proxies(auth=True)
    with TLSTerminator(int(server.base_url.split(":")[2].split("/")[0]), context) as tls:
        base_url = f"https://localhost:{tls.port}/api/v1"
        r = credits(base_url, server.api_key, env={**proxy_env(https=open_proxy.url()),
                                                   "SSL_CERT_FILE": str(pem)})
        assert r.code == 0, r.stderr
        assert r.records()[0]["remaining"] == 42
        assert open_proxy.targets() and len(open_proxy.targets()) == tls.connections
        # --proxy with credentials; then a wrong password: an error, the password not shown
        r = credits(base_url, server.api_key, "--proxy", auth_proxy.url(USER, PASSWORD),
                    env={**proxy_env(), "SSL_CERT_FILE": str(pem)})
        assert r.code == 0, r.stderr
        r = credits(base_url, server.api_key, "--proxy", auth_proxy.url(USER, "Wr0ng-pa55word"),
                    env={**proxy_env(), "SSL_CERT_FILE": str(pem)})
        assert r.code == 1 and "407" in r.stderr, r.stderr
        assert "Wr0ng-pa55word" not in r.stderr and PASSWORD not in r.stderr
        # NO_PROXY: straight to the origin although the proxy variable names a dead port
        with dead_port() as port:
            dead = f"http://127.0.0.1:{port}"
            r = credits(base_url, server.api_key, env={**proxy_env(https=dead, no="localhost"),
                                                       "SSL_CERT_FILE": str(pem)})
        assert r.code == 0, r.stderr


# -- the rules, as functions ---------------------------------------------------------------------

def test_proxy_choice_from_the_environment(monkeypatch):
    from kimipipe.openrouter.proxy import proxy_for

    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert proxy_for("https://openrouter.ai/api/v1") is None
    monkeypatch.setenv("ALL_PROXY", "proxy.corp:3128")
    assert str(proxy_for("https://openrouter.ai/api/v1")) == "proxy proxy.corp:3128"
    monkeypatch.setenv("HTTPS_PROXY", "http://upper.corp:8080")
    assert str(proxy_for("https://openrouter.ai/api/v1")) == "proxy upper.corp:8080"
    monkeypatch.setenv("https_proxy", "http://lower.corp")
    assert str(proxy_for("https://openrouter.ai/api/v1")) == "proxy lower.corp:80"
    assert str(proxy_for("http://openrouter.ai/api/v1")) == "proxy proxy.corp:3128"  # ALL_PROXY
    monkeypatch.setenv("NO_PROXY", "example.com, .openrouter.ai")
    assert proxy_for("https://openrouter.ai/api/v1") is None
    assert str(proxy_for("https://example.org/")) == "proxy lower.corp:80"
    assert str(proxy_for("https://openrouter.ai/", "http://explicit:1")) == "proxy explicit:1"


@pytest.mark.parametrize(("host", "port", "no_proxy", "bypass"), [
    ("openrouter.ai", 443, "openrouter.ai", True),
    ("api.openrouter.ai", 443, "openrouter.ai", True),
    ("api.openrouter.ai", 443, ".openrouter.ai", True),
    ("notopenrouter.ai", 443, "openrouter.ai", False),
    ("openrouter.ai", 443, "openrouter.ai:8443", False),
    ("openrouter.ai", 8443, "openrouter.ai:8443", True),
    ("10.1.2.3", 443, "10.0.0.0/8", True),
    ("11.1.2.3", 443, "10.0.0.0/8", False),
    ("::1", 443, "::1", True),
    ("::1", 8080, "[::1]:8080", True),
    ("fd00::5", 443, "fd00::/8", True),
    ("anything", 1, "a.b, *", True),
    ("openrouter.ai", 443, "", False),
])
def test_no_proxy_patterns(host, port, no_proxy, bypass):
    from kimipipe.openrouter.proxy import bypassed

    assert bypassed(host, port, no_proxy) is bypass


def test_proxy_url_parsing_hides_the_password():
    from kimipipe.openrouter.proxy import parse_proxy, scrub

    proxy = parse_proxy("http://us%40er:p%3Ass@proxy.corp:3128")
    import base64
    assert base64.b64decode(proxy.authorization.split()[1]) == b"us@er:p:ss"
    assert "p:ss" not in repr(proxy) and "p%3Ass" not in str(proxy)
    assert scrub("failed: http://us%40er:p%3Ass@proxy.corp:3128 and BasicAuth('p:ss')",
                 "http://us%40er:p%3Ass@proxy.corp:3128") == "failed: http://proxy.corp:3128 and BasicAuth('***')"
    assert os.environ.get("KP_INFER_PROXY") is None
