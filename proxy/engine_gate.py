"""`tracefleet engine-gate`: the only listener on a managed inference pod's port, in front of vLLM on loopback.

A harness pod's containers share one network namespace, so what lets the proxy sidecar reach the engine lets the
agent reach it too. vLLM's `--api-key` guards only `/v1`, `/v2`, `/inference` and `/cohere`; the development routes
weight sync turns on (`/pause`, `/resume`, the weight-update routes, `/sleep`, `/collective_rpc`, ...), `/tokenize`
and `/metrics` answer anyone. The gate answers 401 to every request without the job's key (`Authorization: Bearer`),
on every route but `/health` (the kubelet's probes), and forwards the rest to the engine unchanged: the request as
it came, the answer's bytes as they arrive (an SSE stream is never buffered, nor decompressed), and a client that
goes away closes the engine's request, which is how vLLM learns to abort the generation.

    tracefleet engine-gate --engine http://127.0.0.1:8001 --port 8000   # key: $TRACEFLEET_ENGINE_API_KEY

docs/harbor/cluster-network.md has why and what it leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
from pathlib import Path
from typing import Any

import orjson

from tracefleet.proxy.cli import ENGINE_API_KEY_ENV, engine_api_key
from tracefleet.proxy.dialects.openai_chat import openai_error
from tracefleet.proxy.errors import ProxyError
from tracefleet.vllm import HEALTH_PATH

# hop-by-hop (RFC 9110 7.6.1) and what the client library sets itself
_REQUEST_DROP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"content-length",
                 b"proxy-authorization", b"proxy-connection"}
_RESPONSE_DROP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection"}
# what aiohttp would add on its own: the engine gets the client's headers, not the gate's
_CLIENT_DEFAULTS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
ENGINE_CONNECT_S = 10.0


def _error(kind: str, message: str) -> tuple[int, bytes]:
    err = ProxyError(kind, message)
    return err.status, orjson.dumps(openai_error(err))


class EngineGate:
    """The ASGI app: a key check, then a byte-for-byte relay to `engine_url`."""

    def __init__(self, engine_url: str, api_key: str) -> None:
        self.engine_url = engine_url.rstrip("/")
        self._key = f"Bearer {api_key}".encode()
        self._session: Any = None

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = next((v for k, v in headers if k == b"authorization"), b"")
        return hmac.compare_digest(given, self._key)  # constant time: the key is not guessed byte by byte

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if self.authorized(scope["headers"]):
                await self._relay(scope, receive, send, scope["raw_path"].decode("latin-1"))
            elif scope["path"] == HEALTH_PATH:  # sent on as the one path it is, not as the client spelled it
                await self._relay(scope, receive, send, HEALTH_PATH)
            else:
                await _reply(send, *_error("authentication", "the engine gate needs the job's engine key "
                                                             "(Authorization: Bearer)"))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        import aiohttp

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # no overall or read limit: a long generation streams for as long as it takes; auto_decompress off
                # keeps the answer's bytes (and its content-encoding) as the engine sent them
                self._session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, connect=ENGINE_CONNECT_S), auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, scope: dict[str, Any], receive: Any, send: Any, path: str) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        url = self.engine_url + path
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in _REQUEST_DROP]
        relay = asyncio.ensure_future(self._forward(scope["method"], url, headers, bytes(body), send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not relay.done():
                relay.cancel()  # the client went away: closing the engine's response aborts its generation
        if relay.done() and not relay.cancelled():
            relay.result()

    async def _forward(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, send: Any) -> None:
        import aiohttp

        started = False
        try:
            async with self._session.request(method, url, headers=headers, data=body or None, allow_redirects=False,
                                             skip_auto_headers=_CLIENT_DEFAULTS) as resp:
                await send({"type": "http.response.start", "status": resp.status, "headers": _response_headers(resp)})
                started = True
                async for chunk in resp.content.iter_any():  # each read as it comes: SSE events are not held back
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except aiohttp.ClientError as exc:
            if not started:
                await _reply(send, *_error("engine_unavailable", f"engine gate: no answer from the engine at "
                                                                 f"{self.engine_url}: {type(exc).__name__}: {exc}"))
                return
            # cut off mid-answer: end it there, as the engine's own connection would have
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _response_headers(resp: Any) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in resp.raw_headers if k.decode("latin-1").lower() not in _RESPONSE_DROP]


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Refuse every request without the engine key (all routes but /health) and forward the rest, "
                          "streaming, to ENGINE: a managed inference pod's only listener, in front of vLLM on loopback.")
    parser.add_argument("--engine", required=True, metavar="URL", help="the engine's root URL, e.g. http://127.0.0.1:8001")
    parser.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0: the pod's port)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 = pick a free one; default 8000)")
    parser.add_argument("--port-file", type=Path, metavar="FILE", help="write the bound port here once listening")
    parser.add_argument("--api-key-file", type=Path, metavar="FILE",
                        help=f"the key clients must send (default: ${ENGINE_API_KEY_ENV})")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from tracefleet.sockets import listening_socket, write_port_file
    from tracefleet.usage import UsageError

    try:
        key = engine_api_key(args.api_key_file)
    except OSError as exc:
        raise UsageError(f"--api-key-file: {exc}") from None
    if not key:
        raise UsageError(f"no engine key: set ${ENGINE_API_KEY_ENV} or --api-key-file (a gate without one is open)")
    server = uvicorn.Server(uvicorn.Config(EngineGate(args.engine, key), log_level=args.log_level, access_log=False,
                                           timeout_keep_alive=75, proxy_headers=False))
    sock = listening_socket(args.host, args.port, server.config.backlog)
    if args.port_file:
        write_port_file(args.port_file, sock.getsockname()[1])
    print(f"tracefleet engine-gate listening on http://{args.host}:{sock.getsockname()[1]} -> engine {args.engine}",
          flush=True)
    server.run(sockets=[sock])
    return 0
