"""The dashboard's web app (FastAPI): GET routes only, each reading the bucket through the read-only Source.

    /                      jobs and loops under the URI
    /job?path=P            a job: counts, curves, per task success, fail-closed reasons, diagnostics, sessions
    /session?path=P&session=S   a session: its traces, findings, harness and evaluator output (its evidence)
    /trace?path=P&seq=N&trace=T the trace page `tracefleet traces show --html` writes (trainable tokens coloured)
    /loop?path=P           a `tracefleet train` run: its per-step curves
    /compare?a=P&b=Q       two loops' curves on one plot
    /api/fingerprint       changes when anything shown may have: the pages poll it
    /api/job?path=P        a job's counts (and its driver's progress) as JSON
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from tracefleet.contract.dashboard import JOB_ROUTE
from tracefleet.dashboard import figures as fig
from tracefleet.dashboard import pages
from tracefleet.dashboard.source import JobSource, LoopSource, Source

REFRESH_EVERY_S = 1.0  # a listing at most this often, however many tabs poll
# how long a page waits for a refresh (listings and new manifests): on a big bucket the rest arrive after it (the
# page then updates)
MANIFEST_BUDGET_S = 1.0


class Refresher:
    """Refreshes the source at most every REFRESH_EVERY_S, one refresh at a time."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if time.monotonic() - self.source.refreshed_at >= REFRESH_EVERY_S:
                self.source.refresh(MANIFEST_BUDGET_S)


def create_app(source: Source) -> FastAPI:
    app = FastAPI(title="tracefleet dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    refresh = Refresher(source)

    @app.middleware("http")
    async def pages_first(request: Request, call_next: Any) -> Any:
        with source.serving():
            return await call_next(request)

    def render(make: Callable[..., str], *args: Any, **kwargs: Any) -> str:
        """A page from what is read (its arguments: read first); manifest reads wait meanwhile."""
        with source.rendering():
            return make(*args, **kwargs)

    def fragment(request: Request) -> bool:
        return request.headers.get("x-fragment") == "1"

    def job_at(path: str) -> JobSource:
        refresh()
        if path not in source.jobs:
            raise HTTPException(404, f"no job at {path!r} under {source.uri}")
        return source.jobs[path]

    def loop_at(path: str) -> LoopSource:
        refresh()
        if path not in source.loops:
            raise HTTPException(404, f"no training loop at {path!r} under {source.uri}")
        return source.loops[path]

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> str:
        refresh()
        return render(pages.overview, source, fragment=fragment(request))

    @app.get(JOB_ROUTE, response_class=HTMLResponse)
    def job(request: Request, path: str) -> str:
        return render(pages.job_page, source, job_at(path), fragment=fragment(request))

    @app.get("/session", response_class=HTMLResponse)
    def session(request: Request, path: str, session: str) -> str:
        return render(pages.session_page, source, job_at(path), session, fragment=fragment(request))

    @app.get("/trace", response_class=HTMLResponse)
    def trace(path: str, seq: int, trace: str) -> str:
        from tracefleet.traces.reader import BatchReader
        from tracefleet.traces.render import render_html, trace_decoder

        job = job_at(path)
        if seq not in job.manifests:
            raise HTTPException(404, f"job {path!r} has no batch {seq}")
        found = [t for t in BatchReader(job.view, job.name).read(job.manifests[seq]).traces() if t.meta.trace_id == trace]
        if not found:
            raise HTTPException(404, f"batch {seq} of {path!r} has no trace {trace!r}")
        decode, _, _ = trace_decoder([found[0].meta.tokenizer, found[0].meta.model])
        back = pages.link("/session", f"← session {found[0].meta.session_id}", path=path, session=found[0].meta.session_id)
        return render_html(found[0], decode=decode).replace("<body>", f"<body><p class='back'>{back}</p>", 1)

    @app.get("/loop", response_class=HTMLResponse)
    def loop(request: Request, path: str) -> str:
        return render(pages.loop_page, source, loop_at(path), fragment=fragment(request))

    @app.get("/compare", response_class=HTMLResponse)
    def compare(request: Request, a: str, b: str) -> str:
        return render(pages.compare_page, source, loop_at(a), loop_at(b), fragment=fragment(request))

    @app.get("/api/fingerprint", response_class=PlainTextResponse)
    def fingerprint() -> str:
        refresh()
        return source.fingerprint()

    @app.get("/api/job")
    def job_json(path: str) -> dict[str, Any]:
        j = job_at(path)
        f = fig.job_figures([j.manifests[s] for s in sorted(j.manifests)])
        return {"path": path, "batches": f.batches, "sessions": f.sessions, "traces": f.traces, "tokens": f.tokens,
                "trainable_tokens": f.trainable_tokens, "fail_closed": f.fail_closed, "quarantined": f.quarantined,
                "reward_mean": f.reward_mean, "seqs": f.seqs, "rows_read": len(j.rows),
                "progress": j.progress.model_dump(mode="json", by_alias=True) if j.progress else None}

    return app
