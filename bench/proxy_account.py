"""Bench: where the proxy's cost over the floor goes, on the real hop, piece by piece, in instructions.

    .venv/bin/python bench/proxy_account.py [--calls 200] [--tokens 16]   (needs valgrind; ~6 minutes on 2 CPUs)

bench/proxy.py gives the proxy's whole cost over the floor (bench/passthrough.py) in time; on a shared machine
its CPU per call moves by tens of µs between runs, more than most pieces of the proxy weigh, so no timing can
split it. This bench counts instructions instead (valgrind's callgrind: the same count on every run, to ~1%).
It starts the fake engine, the floor and one proxy (`tracefleet proxy`, as bench/proxy.py runs it), both
servers under callgrind, and drives bench/proxy.py's calls at concurrency 1, streamed and not. The proxy is
switched (SIGUSR1) through a ladder of rungs: rung k has the first k pieces of `PIECES` taken out (a no-op,
or a lookup of the first call's result, in place of the piece; what the bench client reads stays an answer).
What a rung saves over the one before is that piece's whole cost, its event-loop turns, allocations and
garbage included; what the last rung still executes over the floor is the rest of the proxy (`CORE`), which
cannot be taken out without taking the answer with it.

Instructions are not time (compiled code such as pydantic's and orjson's runs more of them per µs than the
interpreter, and the kernel's socket work is not counted), so docs/performance.md turns each piece's share into µs
of the gap bench/proxy.py measures.

    python bench/proxy_account.py serve RUNG_FILE -- <tracefleet proxy arguments>

is the proxy's own launcher: `tracefleet proxy`, its rung set on SIGUSR1 from the number in RUNG_FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy import PY, ROOT, drive, free_port, start, start_fake_engine, stop, wait_http  # noqa: E402  (bench/proxy.py)


# -- the pieces: each is (object, attribute, stand-in) patches, applied and undone in the proxy's own process --

Patch = tuple[Any, str, Any]


def _no_metrics() -> list[Patch]:
    from tracefleet.proxy.call import Flight

    return [(Flight, "observe", lambda self: None)]


def _no_fsync() -> list[Patch]:
    from tracefleet.proxy.recording import Persister

    async def persisted(self: Any, session: Any, data: bytes, failed: bool, alone: bool = False) -> None:
        return None

    return [(Persister, "__call__", persisted)]


def _no_record_tail() -> list[Patch]:
    from tracefleet.proxy.call import Flight
    from tracefleet.proxy.versions import EngineVersions

    async def settled(self: Any, state: Any) -> None:
        return None

    return [(Flight, "_line", lambda self: b""), (EngineVersions, "settle", settled)]


def _no_record_head_encode() -> list[Patch]:
    from tracefleet.proxy import pipeline

    return [(pipeline, "precompute_head", lambda head: None)]


def _no_record_head() -> list[Patch]:
    from tracefleet.proxy import pipeline

    return [(pipeline, "RecordHead", lambda *a, **k: None), (pipeline, "kept_headers", lambda raw: None)]


class _Unwatched:
    def cancel(self) -> None:
        return None


def _no_watcher() -> list[Patch]:
    from tracefleet.proxy.call import Flight

    return [(Flight, "_watching", lambda self: _Unwatched())]


class _NoLimits:
    """An engine request with no deadlines: no asyncio timeout, no timer."""

    def __init__(self, limits: Any) -> None:
        self.timer = self

    async def __aenter__(self) -> _NoLimits:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def wait_first(self) -> None:
        return None

    wait_next = disarm = wait_first

    def expired(self) -> bool:
        return False


def _no_limits() -> list[Patch]:
    from tracefleet.proxy import engine_client

    return [(engine_client, "_Limits", _NoLimits)]


class _BareResponse:
    """The answer as the floor sends it: two ASGI messages, one content-type header."""

    def __init__(self, content: bytes, status_code: int = 200, media_type: str = "application/json",
                 headers: Any = None) -> None:
        self.body, self.status = content, status_code

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.body})


def _no_response_object() -> list[Patch]:
    from tracefleet.proxy import pipeline

    return [(pipeline, "Response", _BareResponse)]


def _no_canonical_parse() -> list[Patch]:
    from tracefleet.proxy.dialects.openai_chat import OpenAIChat

    # the bench sends two bodies, streamed or not
    return _cached(OpenAIChat, "parse", lambda body, path_model=None: body.get("stream"))


def _cached(cls: Any, name: str, key: Callable[..., Any]) -> list[Patch]:
    """cls.name replaced by a lookup of what it returned the first time for the same key (sync or async)."""
    method = getattr(cls, name)
    seen: dict[Any, Any] = {}
    if asyncio.iscoroutinefunction(method):
        async def cached_async(self: Any, *args: Any) -> Any:
            k = key(*args)
            if k not in seen:
                seen[k] = await method(self, *args)
            return seen[k]
        return [(cls, name, cached_async)]

    def cached(self: Any, *args: Any) -> Any:
        k = key(*args)
        if k not in seen:
            seen[k] = method(self, *args)
        return seen[k]
    return [(cls, name, cached)]


def _no_answer_dict() -> list[Patch]:
    from tracefleet.proxy.dialects.openai_chat import OpenAIChat

    return _cached(OpenAIChat, "response", lambda conv, state: None)


def _no_engine_body() -> list[Patch]:
    from tracefleet.proxy import token_engine

    sampling: dict[Any, Any] = {}

    def record(conv: Any, body: Any) -> Any:
        key = body.get("stream")
        if key not in sampling:
            sampling[key] = token_engine.sampling_record.__wrapped__(conv, body)  # type: ignore[attr-defined]
        return sampling[key]

    record.__wrapped__ = token_engine.sampling_record  # type: ignore[attr-defined]
    return [*_cached(token_engine.ServerTokenEngine, "_body", lambda conv, stream, version=0: stream),
            (token_engine, "sampling_record", record)]


def _orjson_cached_loads(module: Any, **more: Any) -> list[Patch]:
    """module.orjson replaced by one whose loads looks up what it returned the first time for the same bytes."""
    import orjson

    parsed: dict[bytes, Any] = {}

    def loads(data: Any) -> Any:
        key = bytes(data)
        if key not in parsed:
            parsed[key] = orjson.loads(key)
        return parsed[key]

    return [(module, "orjson", types.SimpleNamespace(dumps=orjson.dumps, loads=loads, **more))]


def _no_answer_parse() -> list[Patch]:
    from tracefleet.proxy import engine_client

    return _orjson_cached_loads(engine_client)


def _no_request_parse() -> list[Patch]:
    import orjson

    from tracefleet.proxy import pipeline

    return _orjson_cached_loads(pipeline, JSONDecodeError=orjson.JSONDecodeError)


def _no_authentication() -> list[Patch]:
    from tracefleet.proxy.pipeline import Proxy

    return _cached(Proxy, "authenticate", lambda scope: None)


class _ConstantWriter:
    """A streamed answer's events as constant bytes (what the SSE rendering costs, taken out)."""

    def start(self) -> bytes:
        return b"data: {}\n\n"

    def text(self, delta: str) -> bytes:
        return b"data: {}\n\n"

    reasoning = text

    def tool_call(self, call: Any) -> bytes:
        return b"data: {}\n\n"

    def end(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, err: Any) -> bytes:
        return b"data: {}\n\n"

    def ping(self) -> bytes:
        return b": ping\n\n"


def _no_sse_rendering() -> list[Patch]:
    from tracefleet.proxy.dialects.openai_chat import OpenAIChat

    return [(OpenAIChat, "writer", lambda self, conv, state: _ConstantWriter())]


PIECES: list[tuple[str, Callable[[], list[Patch]]]] = [
    ("metrics: 5 Prometheus observations per call (after the answer)", _no_metrics),
    ("capture durability: the record's append + fsync before the last byte", _no_fsync),
    ("capture record tail: outcome fields, token ids, logprobs encoded; weight-version stamp", _no_record_tail),
    ("capture record head encode: canonical model_dump + orjson (while the engine works)", _no_record_head_encode),
    ("capture record head: its fields, the kept headers", _no_record_head),
    ("disconnect watcher: one task per call, its receive() and cancel", _no_watcher),
    ("engine time limits: one asyncio.timeout and one deadline timer per engine request", _no_limits),
    ("starlette Response for a whole answer (headers, content-length)", _no_response_object),
    ("canonical model: the dialect parse into pydantic", _no_canonical_parse),
    ("the dialect's answer dict (not streamed)", _no_answer_dict),
    ("engine request body + sampling record", _no_engine_body),
    ("engine answer JSON parse (orjson; 18 chunks streamed)", _no_answer_parse),
    ("the dialect's SSE events (streamed)", _no_sse_rendering),
    ("the request's JSON parse (orjson)", _no_request_parse),
    ("authentication: the credential headers, the session lookup", _no_authentication),
]
CORE = ("the ASGI dispatch and the call's coroutines (route, admit, body read, pause check), the call state and "
        "its id, the Flight (calls in flight, cut-offs), the token engine's generators (answer -> token ids, "
        "logprobs, text), orjson encoding the engine request and the answer, aiohttp sending a JSON body and "
        "reading the answer whole")


class Ladder:
    """Every piece's patches, and which are applied: `set(k)` takes the first k pieces out, puts the rest back."""

    def __init__(self) -> None:
        self.patches = [take_out() for _, take_out in PIECES]
        self.originals = [[(obj, attr, getattr(obj, attr)) for obj, attr, _ in group] for group in self.patches]

    def set(self, rung: int) -> None:
        for k, group in enumerate(self.patches):
            for obj, attr, value in (group if k < rung else self.originals[k]):
                setattr(obj, attr, value)


def serve(rung_file: Path, proxy_args: list[str]) -> int:
    """`tracefleet proxy` in this process, its rung set on SIGUSR1 from the number in `rung_file`."""
    ladder = Ladder()

    def set_rung(signum: int, frame: Any) -> None:
        rung = int(rung_file.read_text())
        ladder.set(rung)
        rung_file.with_suffix(".set").write_text(str(rung))

    signal.signal(signal.SIGUSR1, set_rung)
    from tracefleet.cli import main

    return main(["proxy", *proxy_args])


VALGRIND = ["valgrind", "--tool=callgrind", "--dump-instr=no", "--collect-jumps=no", "--error-limit=no", "-q"]


class Meter:
    """Instructions a server executes, from callgrind (zeroed and dumped around a run of calls)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out, self.dumps = pid, out, 0

    def _control(self, *args: str) -> None:
        # uvicorn's main loop ticks every 0.1 s, so the server takes the command without a request to wake it
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True, capture_output=True, timeout=120)

    def zero(self) -> None:
        self._control("-z")

    def dump(self) -> int:
        """Instructions since the last zero."""
        self._control("-d")
        self.dumps += 1
        dump = Path(f"{self.out}.{self.dumps}")
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "serve":
        rest = sys.argv[3:]
        return serve(Path(sys.argv[2]), rest[1:] if rest[:1] == ["--"] else rest)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls per (rung, stream) cell, under callgrind")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per fake answer")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("bench/proxy_account.py needs valgrind (callgrind counts the instructions)")
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="tf-account-"))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp
    capture = Path(tempfile.mkdtemp(prefix="tf-account-cap-", dir=shm))
    rung_file = tmp / "rung"
    procs = []
    try:
        fport, pport = free_port(), free_port()
        engine = start_fake_engine(procs, args.tokens, tmp / "engine.log")
        procs.append(start([*VALGRIND, f"--callgrind-out-file={tmp}/floor.cg", PY, str(ROOT / "bench" / "passthrough.py"),
                            "--engine", engine, "--port", str(fport)], log=tmp / "floor.log"))
        secret = "tfs-" + secrets.token_hex(16)
        procs.append(start([*VALGRIND, f"--callgrind-out-file={tmp}/proxy.cg", PY, __file__, "serve", str(rung_file),
                            "--", "--engine", engine, "--capture-dir", str(capture), "--port", str(pport),
                            "--session", f"bench:{secret}"], log=tmp / "proxy.log"))
        floor = Meter(procs[1].pid, tmp / "floor.cg")
        proxy = Meter(procs[2].pid, tmp / "proxy.cg")
        furl, purl = f"http://127.0.0.1:{fport}", f"http://127.0.0.1:{pport}"
        wait_http(furl + "/health", timeout=900)
        wait_http(purl + "/health", timeout=900)

        def set_rung(rung: int) -> None:
            rung_file.write_text(str(rung))
            done = rung_file.with_suffix(".set")
            done.unlink(missing_ok=True)
            os.kill(proxy.pid, signal.SIGUSR1)
            deadline = time.time() + 60
            while not (done.exists() and done.read_text() == str(rung)):
                if time.time() > deadline:
                    raise RuntimeError(f"the proxy did not take rung {rung}")
                time.sleep(0.05)

        def per_call(meter: Meter, url: str, key: str, stream: bool) -> float:
            asyncio.run(drive(url + "/v1/chat/completions", key, 1, 20, stream))  # warm: this rung's code paths
            meter.zero()
            asyncio.run(drive(url + "/v1/chat/completions", key, 1, args.calls, stream))
            return meter.dump() / (args.calls + 2)  # drive's 2 warm-up calls

        rungs = range(len(PIECES) + 1)
        for stream in (False, True):  # warm-up: lazy imports, pools, caches
            asyncio.run(drive(furl + "/v1/chat/completions", "none", 1, 100, stream))
            for rung in rungs:
                set_rung(rung)
                asyncio.run(drive(purl + "/v1/chat/completions", secret, 1, 50, stream))
        print(f"# instructions per call on the real hop (valgrind callgrind, every thread of the server process), "
              f"fake engine, {args.tokens} tokens/answer, concurrency 1, {args.calls} calls per cell, capture on tmpfs; "
              f"one proxy process switched between rungs: rung k has the first k pieces taken out")
        for stream in (False, True):
            f = per_call(floor, furl, "none", stream)
            counts = []
            for rung in rungs:
                set_rung(rung)
                counts.append(per_call(proxy, purl, secret, stream))
            whole = counts[0]
            print(f"\n## {'streamed' if stream else 'not streamed'}: the floor {f / 1e3:.0f}k instructions per call, "
                  f"the proxy {whole / 1e3:.0f}k ({whole / f:.2f}x)")
            print(f"{'over the floor, piece by piece':<88} {'k instr':>8} {'share':>6}")
            print(f"{'  all of it':<88} {(whole - f) / 1e3:8.1f} {1:6.0%}")
            for k, (piece, _) in enumerate(PIECES, start=1):
                saved = counts[k - 1] - counts[k]
                print(f"{'  ' + piece:<88} {saved / 1e3:8.1f} {saved / (whole - f):6.0%}")
            left = counts[-1] - f
            print(f"{'  what is left (below)':<88} {left / 1e3:8.1f} {left / (whole - f):6.0%}")
            print(f"{'  (the proxy with every piece above taken out: x the floor)':<88} {counts[-1] / f:7.2f}x")
        print(f"\n# what is left: {CORE}")
        print("# instructions are not time: pydantic's and orjson's compiled code runs more of them per µs than the "
              "interpreter does, and the kernel's socket work (the same for both) is not counted; they are what a "
              "shared machine cannot blur (bench/proxy.py's CPU per call moves by ±50 µs between runs here)")
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(capture, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
