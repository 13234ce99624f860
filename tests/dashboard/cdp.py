"""Plain helpers (no fixtures): a page open in real headless Chromium, driven over the DevTools protocol, so a
test can watch a live page change without reloading it (`--dump-dom` sees one moment only).

    with BrowserPage(tmp_path) as page:
        page.goto(url)
        page.wait_for("document.querySelectorAll('.dot').length > 3")
        page.screenshot(tmp_path / "page.png")
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

from fixtures.browser import chromium
from fixtures.controlplane import free_port
from fixtures.servers import stop_process_group


class BrowserPage:
    def __init__(self, tmp: Path, *, width: int = 1400, height: int = 1800) -> None:
        self.port = free_port()
        # --no-sandbox: the tests may run as root, where Chromium's sandbox refuses to start.
        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             f"--remote-debugging-port={self.port}", "--remote-allow-origins=*", f"--user-data-dir={tmp / 'chromium'}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "chromium.log", "w"), start_new_session=True)  # noqa: SIM115
        deadline = time.monotonic() + 60
        target = None
        while target is None:
            assert self.proc.poll() is None, (tmp / "chromium.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Chromium's DevTools endpoint did not come up in 60 s"
            try:
                targets = httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=2).json()
                target = next((t for t in targets if t.get("type") == "page"), None)
            except httpx.HTTPError:
                pass
            if target is None:
                time.sleep(0.2)
        self._stack = ExitStack()
        self.ws = self._stack.enter_context(connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30))
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        call = next(self._ids)
        self.ws.send(json.dumps({"id": call, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == call:
                assert "error" not in msg, msg
                return msg["result"]

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'", timeout_s=60)

    def wait_for(self, expression: str, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.eval(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"waited {timeout_s} s for {expression}"
            time.sleep(0.25)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"screenshot: {path}")
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            stop_process_group(self.proc)

    def __enter__(self) -> BrowserPage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
