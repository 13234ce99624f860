"""Proxy test helpers: run the real proxy app (uvicorn, loopback, port 0) in front of a real engine."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import ProxyConfig

ADMIN = "admin-token-for-tests"


@dataclass
class RunningProxy:
    url: str
    capture_dir: Path
    app: Any
    server: uvicorn.Server

    def admin(self, method: str, path: str, json: Any = None, token: str = ADMIN) -> httpx.Response:
        return httpx.request(method, self.url + path, json=json, headers={"authorization": f"Bearer {token}"}, timeout=30)

    def new_session(self, **body: Any) -> dict[str, Any]:
        r = self.admin("POST", "/admin/sessions", body)
        assert r.status_code == 201, r.text
        return r.json()


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, int, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "proxy did not start"
        time.sleep(0.01)
    return server, port, thread


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Any]:
    """Factory: start_proxy(engine_url, **config_overrides) -> RunningProxy (stopped at teardown)."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(engine_url: str, **overrides: Any) -> RunningProxy:
        capture = tmp_path / f"capture{len(running)}"
        config = ProxyConfig(engine_url=engine_url, capture_dir=capture, admin_token=ADMIN, **overrides)
        app = create_app(config)
        server, port, thread = serve_in_thread(app)
        running.append((server, thread))
        return RunningProxy(url=f"http://127.0.0.1:{port}", capture_dir=capture, app=app, server=server)

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10)
