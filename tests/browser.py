"""A page opened in a real browser, as a person opens it: Debian's headless Chromium.

`open_page(path, screenshot=PNG)` starts Chromium (a fresh profile, no sandbox as root, no
background networking, which this machine's closed network would refuse) with a DevTools
port, and over the DevTools protocol (aiohttp's websocket client, a kimipipe dependency)
opens `file://PATH`, records every network request the page makes, every console message,
log entry and uncaught exception, waits for the load event, runs PROBE in the page, and
takes a full-page screenshot. The tests then assert on what it saw.

`.ci/run` installs Chromium (Debian's `chromium` package); without it the test skips,
which CI turns into an error.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--disable-extensions", "--hide-scrollbars", "--remote-debugging-port=0"]
WIDTH = 1280

# Per figure of the page: its id, and per panel (matplotlib's `axes_N` group) how many data
# marks (`kp-data-*` ids) it holds and how many of them have an area on screen: an axis
# with nothing drawn has no marks, or only marks of no area (bars of height 0, a
# histogram's outline lying flat on its baseline because every value fell outside it).
PROBE = """(() => [...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  const panels = [...f.querySelectorAll('svg g[id^="axes_"]')].map(axes => {
    const marks = [...axes.querySelectorAll('[id^="kp-data-"]')];
    const drawn = marks.filter(m => { const b = m.getBoundingClientRect();
                                      return b.width > 0.5 && b.height > 0.5; });
    return {id: axes.id, marks: marks.length, drawn: drawn.length};
  });
  return {id: f.id, panels: panels, shown: svg ? svg.getBoundingClientRect().width : 0};
}))()"""


@dataclass
class Seen:
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    console: list[str] = field(default_factory=list)  # console messages, log entries, exceptions
    figures: list[dict] = field(default_factory=list)  # PROBE's answer
    notes: int = 0  # figures saying why there is nothing to draw
    title: str = ""


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def open_page(page: Path, screenshot: Path, timeout: float = 60) -> Seen:
    profile = tempfile.mkdtemp(prefix="kp-chromium-")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # Chromium says where its DevTools listen, then goes on
            if line.startswith("DevTools listening on "):
                browser_url = line.split(" on ", 1)[1].strip()
                break
        else:
            raise AssertionError(f"chromium exited ({proc.wait()}) without a DevTools port")
        return asyncio.run(asyncio.wait_for(_drive(browser_url, page.resolve(), screenshot), timeout))
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


async def _drive(browser_url: str, page: Path, screenshot: Path) -> Seen:
    import aiohttp

    seen = Seen()
    loaded = asyncio.Event()
    pending: dict[int, asyncio.Future] = {}
    counter = iter(range(1, 1 << 30))
    async with aiohttp.ClientSession() as http, http.ws_connect(browser_url, max_msg_size=0) as ws:

        async def call(method: str, session: str | None = None, **params):
            n = next(counter)
            pending[n] = asyncio.get_running_loop().create_future()
            await ws.send_str(json.dumps({"id": n, "method": method, "params": params,
                                          **({"sessionId": session} if session else {})}))
            answer = await pending[n]
            del pending[n]
            if "error" in answer:
                raise AssertionError(f"{method}: {answer['error']}")
            return answer["result"]

        def on_event(message: dict) -> None:
            method, params = message.get("method"), message.get("params", {})
            if method == "Network.requestWillBeSent":
                seen.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                seen.console.append(f"console.{params['type']}: "
                                    + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                seen.console.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Log.entryAdded":
                entry = params["entry"]
                seen.console.append(f"log {entry['level']} ({entry['source']}): {entry['text']}")
            elif method == "Page.loadEventFired":
                loaded.set()

        async def read() -> None:
            async for msg in ws:
                message = json.loads(msg.data)
                if "id" in message and message["id"] in pending:
                    pending[message["id"]].set_result(message)
                else:
                    on_event(message)

        reader = asyncio.create_task(read())
        target = (await call("Target.createTarget", url="about:blank"))["targetId"]
        session = (await call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
        for domain in ("Network", "Log", "Runtime", "Page"):
            await call(f"{domain}.enable", session)
        await call("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=900,
                   deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", session, url=page.as_uri())
        await loaded.wait()
        probe = await call("Runtime.evaluate", session, expression=PROBE, returnByValue=True)
        seen.figures = probe["result"]["value"]
        notes = await call("Runtime.evaluate", session, returnByValue=True,
                           expression="[document.querySelectorAll('figure.note').length, document.title]")
        seen.notes, seen.title = notes["result"]["value"]
        metrics = await call("Page.getLayoutMetrics", session)
        height = int(metrics["cssContentSize"]["height"])
        shot = await call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1})
        import base64
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        await call("Browser.close")
        reader.cancel()
    return seen
