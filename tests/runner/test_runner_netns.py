"""The loopback-only network namespace: the proxy port is reachable through the bridge, the host's
other loopback services are not."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.sandbox import SandboxOptions, netns_available, run_sandboxed

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
