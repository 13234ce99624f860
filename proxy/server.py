"""The proxy under uvicorn: `proxy_server(app, **uvicorn options)`, as `tracefleet proxy` (the pod sidecar)
and the local runner's in-process proxy serve it.

uvicorn's own shutdown (SIGTERM, Ctrl-C, `should_exit`) stops accepting, then waits for every connection
to finish, and only after `timeout_graceful_shutdown` cancels what still runs. A model call still generating
would hold it until the engine is done (a GPU slot busy for nobody, and on Kubernetes the pod killed after its
grace period with the call never recorded). So the proxy's calls in flight are cut off first
(`Proxy.shut_down`: recorded as `proxy_shutdown`, engine requests closed, the harness told), and the
lifespan's shutdown then drains the capture writer and closes every session's log.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from tracefleet.proxy.pipeline import Proxy

# How long the calls cut off at shutdown get to record themselves and send their error (they need
# milliseconds: the record is written inline and the engine request closed on the way out).
CUT_OFF_WAIT_S = 2.0
# Then uvicorn waits this long for connections before cancelling what is left (a call cancelled then is
# still recorded, as `proxy_shutdown`). Well inside a pod's 30 s grace period, which the upload also needs.
GRACEFUL_SHUTDOWN_S = 5.0


class ProxyServer(uvicorn.Server):
    """uvicorn's server, with the proxy's calls in flight cut off before it waits for connections."""

    def __init__(self, config: uvicorn.Config, proxy: Proxy) -> None:
        super().__init__(config)
        self.proxy = proxy

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # no new connections while the calls are cut off (uvicorn closes them again: a no-op)
            server.close()
        await self.proxy.shut_down(CUT_OFF_WAIT_S)
        await super().shutdown(sockets)


def proxy_server(app: FastAPI, **options: Any) -> ProxyServer:
    """A uvicorn server for `create_app(...)`'s app (`options`: uvicorn.Config's)."""
    options.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
    return ProxyServer(uvicorn.Config(app, **options), app.state.proxy)
