"""Proxy test helpers: run the real proxy app (uvicorn, loopback, port 0) in front of a real engine."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import ProxyConfig

from fixtures.servers import ServedApp, serve_in_thread

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


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Any]:
    """Factory: start_proxy(engine_url, **config_overrides) -> RunningProxy (stopped at teardown)."""
    running: list[ServedApp] = []

    def start(engine_url: str, **overrides: Any) -> RunningProxy:
        capture = tmp_path / f"capture{len(running)}"
        config = ProxyConfig(engine_url=engine_url, capture_dir=capture, admin_token=ADMIN, **overrides)
        app = create_app(config)
        served = serve_in_thread(app)
        running.append(served)
        return RunningProxy(url=served.url, capture_dir=capture, app=app, server=served.server)

    yield start
    for served in running:
        served.stop()
