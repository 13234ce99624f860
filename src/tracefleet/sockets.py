"""The listening socket the `tracefleet proxy`, `engine` and `engine-gate` servers hand to uvicorn, and the port file
that announces it."""

from __future__ import annotations

import socket
from pathlib import Path


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A socket bound to host:port (0: a free port) and already listening.

    Listening before the server announces its port (a port file, a "listening" line) is the point: a client
    that connects the moment it reads the port waits in the backlog until uvicorn accepts, instead of being
    refused. uvicorn given a bound socket only listens once it has started, after the app's own start-up.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def write_port_file(path: Path, port: int) -> None:
    """`port` into `path` whole (written beside it, then renamed): a reader never sees a partial number."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.replace(path)
