"""The floor for the proxy bench: the cheapest proxy this Python stack can be. It is a raw ASGI app on
uvicorn (httptools, uvloop) that forwards each request to the engine with aiohttp and relays the bytes
back as they arrive. It does no authentication, parsing, token capture, fsync or metrics.

    python bench/passthrough.py --engine URL --port N

The bench reports it next to the proxy. What the proxy adds over this floor is tracefleet's own cost;
the floor is what the hop costs on this machine (loopback sockets, the event loop, HTTP parsing).
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn


def passthrough_app(engine: str) -> Any:
    client: aiohttp.ClientSession | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal client
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if client is not None:
                await client.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if client is None:
            client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        async with client.request(scope["method"], engine + scope["path"], data=body or None,
                                  headers={"content-type": "application/json"}) as resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", resp.headers.get("content-type", "application/json").encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(passthrough_app(args.engine.rstrip("/")), host="127.0.0.1", port=args.port, log_level="warning",
                access_log=False, proxy_headers=False)


if __name__ == "__main__":
    main()
