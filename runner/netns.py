"""Loopback-only network namespace with the proxy reachable, and nothing else.

A fresh network namespace (`unshare -rn`) has its own loopback and no route out, so the proxy on the
host's 127.0.0.1 is unreachable from inside. The filesystem is shared, though: the runner serves a
Unix socket outside (`UnixToTcpBridge`, forwarding to the proxy), and this module's entry point,
run as the first process inside the namespace, brings `lo` up, listens on 127.0.0.1:PORT and
forwards each connection to that socket, then runs the harness and exits with its exit code.

    unshare -rn python -m tracefleet.runner.netns --port P --socket S -- harness args...

With `--workdir DIR` (`unshare -rmn`: a mount namespace too) the harness starts in DIR, the job's
spec.harness.workspace.workdir (/workspace unless the job says otherwise), as it does in a pod: the
session's own folder is bound there in a view of this machine's root (`workdir_view`). Every session
then sees the same working directory, which a harness such as Pi writes into its system prompt, so
the sessions of a job share that prompt's tokens (in the engine's prefix cache as in the trainer).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

CHUNK = 64 * 1024
# mount(2) flags (linux/mount.h)
MS_BIND, MS_REC, MS_UNBINDABLE = 4096, 16384, 1 << 17
VIEW_DIR = ".view"  # beside the session's folder: the mount point of the view's root


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or fstype} on {target}: {os.strerror(errno)}")


def workdir_view(host_dir: str, workdir: str) -> None:
    """Make this process's root a view of the machine's in which `workdir` is `host_dir`, and start there.

    The view's root is a tmpfs holding a recursive bind of each of the machine's top-level entries, so a
    workdir that does not exist here (/workspace) is created in the tmpfs, not on the machine. That tmpfs
    is unbindable: the binds of the machine's folders that hold it do not repeat it inside the view."""
    root = os.path.join(os.path.dirname(host_dir), VIEW_DIR)
    os.makedirs(root, exist_ok=True)
    _mount("tracefleet-view", root, "tmpfs", 0)
    _mount(None, root, None, MS_UNBINDABLE)
    for name in os.listdir("/"):
        source, target = "/" + name, os.path.join(root, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif os.path.isdir(source):
            os.mkdir(target)
            _mount(source, target, None, MS_BIND | MS_REC)
        else:
            open(target, "w").close()
            _mount(source, target, None, MS_BIND)
    inside = root + os.path.normpath(workdir)
    os.makedirs(inside, exist_ok=True)  # under a machine folder (/tmp/x) this makes the mount point there
    _mount(host_dir, inside, None, MS_BIND | MS_REC)
    os.chroot(root)
    os.chdir(workdir)
    os.environ["PWD"] = workdir


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - already torn down
            pass


async def _splice(
    client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, upstream: tuple
) -> None:
    try:
        if upstream[0] == "unix":
            up_reader, up_writer = await asyncio.open_unix_connection(upstream[1])
        else:
            up_reader, up_writer = await asyncio.open_connection(upstream[1], upstream[2])
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(_pipe(client_reader, up_writer), _pipe(up_reader, client_writer))


class UnixToTcpBridge:
    """Outside the namespace: a Unix socket whose connections are forwarded to host:port."""

    def __init__(self, socket_path: Path, host: str, port: int) -> None:
        self.socket_path = Path(socket_path)
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="netns-bridge", daemon=True)

    def start(self) -> UnixToTcpBridge:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()

        async def serve() -> asyncio.base_events.Server:
            return await asyncio.start_unix_server(
                lambda r, w: _splice(r, w, ("tcp", self.host, self.port)), path=str(self.socket_path)
            )

        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=10)
        return self

    def close(self) -> None:
        if self._server is not None:
            server = self._server

            async def stop() -> None:
                server.close()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if self.socket_path.exists():
            self.socket_path.unlink()


def _inside(port: int, socket_path: str, argv: list[str], workdir: str | None = None) -> int:
    if workdir is not None:
        try:
            workdir_view(os.getcwd(), workdir)
        except OSError as exc:
            print(f"tracefleet netns: cannot start the harness in {workdir}: {exc}", file=sys.stderr)
            return 125
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(
            asyncio.start_server(lambda r, w: _splice(r, w, ("unix", socket_path)), "127.0.0.1", port)
        )
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    if not ready.wait(10):
        print("tracefleet netns: bridge did not start", file=sys.stderr)
        return 125
    # The harness stays in our process group (the runner kills the group on timeout).
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracefleet.runner.netns")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--workdir", help="start the harness here, the current folder bound on it")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return _inside(args.port, args.socket, command, args.workdir)


if __name__ == "__main__":
    raise SystemExit(main())
