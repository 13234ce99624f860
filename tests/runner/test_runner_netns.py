"""The loopback-only network namespace: the proxy port is reachable through the bridge, the host's
other loopback services are not."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.capture import read_capture_log
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.services import InProcessProxy
from tracefleet.runner.sandbox import SandboxOptions, netns_available, run_sandboxed

CLIENT = Path(__file__).resolve().parents[1] / "fixtures" / "abandoning_client.py"
PROBE = """
import sys, urllib.request
ok = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=5).status
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[2]}/", timeout=2)
    other = "reachable"
except OSError:
    other = "blocked"
print(ok, other)
"""


def _server() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_netns_reaches_only_the_bridged_port(tmp_path: Path) -> None:
    # This machine allows unprivileged user+net namespaces; the summary of `tracefleet run` says so too.
    assert netns_available(), "unshare -rn is expected to work on this machine"
    proxy, other = _server(), _server()
    proxy_port, other_port = proxy.server_address[1], other.server_address[1]
    bridge = UnixToTcpBridge(tmp_path / "proxy.sock", "127.0.0.1", proxy_port).start()
    try:
        # On the host both answer; inside, the proxy port (same number) is the only one that does.
        result = run_sandboxed(
            [sys.executable, "-c", PROBE, str(proxy_port), str(other_port)],
            cwd=tmp_path, home=tmp_path / "home", timeout_s=60,
            stdout_path=tmp_path / "out", stderr_path=tmp_path / "err",
            options=SandboxOptions(netns=True, bridge_port=proxy_port, bridge_socket=tmp_path / "proxy.sock"),
        )
        assert result.exit_code == 0, (tmp_path / "err").read_text()
        assert (tmp_path / "out").read_text().split() == ["200", "blocked"]
    finally:
        bridge.close()
        proxy.shutdown()
        other.shutdown()


@pytest.mark.parametrize(("dialect", "stream"), [("openai-chat", False), ("anthropic", True)])
def test_a_call_abandoned_inside_the_namespace_is_recorded_and_cancelled(
        scripted_engine: Any, tmp_path: Path, dialect: str, stream: bool) -> None:
    """The bridge passes a harness's hang-up on: the proxy records the call and the engine stops."""
    scripted_engine.configure(token_delay_s=0.02, no_tools_text=" ".join(f"word{i}" for i in range(100)))
    capture = tmp_path / "capture"
    proxy = InProcessProxy(ProxyPlan(engine_url=scripted_engine.url, mode="server"), capture_dir=capture).start()
    s = ProxyAdmin(proxy.url, proxy.admin_token).create_session()
    port = proxy.port
    bridge = UnixToTcpBridge(tmp_path / "proxy.sock", "127.0.0.1", port).start()
    try:
        result = run_sandboxed(
            [sys.executable, str(CLIENT), "127.0.0.1", str(port), dialect, "1" if stream else "0", s.secret, "1.0"],
            cwd=tmp_path, home=tmp_path / "home", timeout_s=60,
            stdout_path=tmp_path / "out", stderr_path=tmp_path / "err",
            options=SandboxOptions(netns=True, bridge_port=port, bridge_socket=tmp_path / "proxy.sock"),
        )
        assert result.exit_code == 0, (tmp_path / "err").read_text()
        hung_up = float((tmp_path / "out").read_text())
        log = capture / f"{s.session_id}.jsonl"
        deadline = hung_up + 1.0
        while not (log.exists() and read_capture_log(log).records) and time.time() < deadline:
            time.sleep(0.02)
        recs = read_capture_log(log).records if log.exists() else []
        assert [r.error.kind for r in recs if r.error] == ["client_disconnect"], recs
        assert recs[0].timings.done_at - hung_up < 1.0
        deadline = time.monotonic() + 5
        while scripted_engine.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scripted_engine.running() == 0
    finally:
        bridge.close()
        proxy.stop()


def test_where_no_mount_namespace_is_allowed_the_harness_starts_in_its_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's workdir needs a mount namespace beside the network one (runner.netns.workdir_view); where this
    machine allows only the network one, the harness runs there in its session's folder, the preset told so."""
    from tracefleet.contract.session import EvaluatorSpec, HarnessConfig, SessionPlan, Task
    from tracefleet.runner import session

    plan = SessionPlan(index=0, session_id="j-s0", job="j", task=Task(id="t", prompt="p"), group_id="j/t", model="m",
                       harness=HarnessConfig(netns=True, bridge_socket=str(tmp_path / "s")),
                       evaluator=EvaluatorSpec(type="command", command="true"))
    place = session.HostPlace(admin=None, proxy_url="http://127.0.0.1:9", session_root=tmp_path)  # type: ignore[arg-type]
    assert place.harness_workdir(plan, tmp_path) == Path("/workspace") and place._sandbox(plan.harness).workdir == "/workspace"
    monkeypatch.setattr(session, "workdir_view_available", lambda: False)
    assert place.harness_workdir(plan, tmp_path) == tmp_path
    options = place._sandbox(plan.harness)
    assert options.netns and options.workdir is None
