"""The dashboard's HTML: plain server-rendered pages. The one script polls the fingerprint and swaps the
`#live` part of the page when it changes, so a batch sealed or a step logged shows without a reload.

Counts carry `data-count` attributes and each chart is a `<figure id=chart-…>`: what a person reads is
what a test finds.
"""

from __future__ import annotations

import html
import time
from typing import Any
from urllib.parse import urlencode

from tracefleet.dashboard import figures as fig
from tracefleet.dashboard.charts import line_chart
from tracefleet.contract.progress import JobProgress
from tracefleet.dashboard.source import JobSource, LoopSource, Source

POLL_MS = 2000
SESSIONS_SHOWN = 100  # the newest sessions a job page lists
TASKS_CHARTED = 12

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:90rem}
a{color:#0645ad}h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:1.6rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.2rem .7rem;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f5f5f5}.num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:flex;flex-wrap:wrap;gap:1rem}.chart{margin:0}
.muted{color:#777}.bad{color:#b00}pre{background:#f7f7f7;padding:.6rem;white-space:pre-wrap;max-height:24rem;overflow:auto}
.cards{display:flex;flex-wrap:wrap;gap:.6rem}.card{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;min-width:7rem}
.card b{display:block;font-size:1.3rem}
"""

_SCRIPT = """<script>
let fp = null;
async function tick() {
  try {
    const t = await (await fetch("/api/fingerprint", {cache: "no-store"})).text();
    if (fp !== null && t !== fp) {
      const r = await fetch(location.href, {headers: {"X-Fragment": "1"}, cache: "no-store"});
      document.getElementById("live").innerHTML = await r.text();
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    }
    fp = t;
  } catch (e) { /* the server restarted or is busy: try again */ }
  setTimeout(tick, %d);
}
tick();
</script>""" % POLL_MS


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def link(route: str, text: str, **params: Any) -> str:
    return f'<a href="{route}?{esc(urlencode(params))}">{esc(text)}</a>'


def num(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:,}" if isinstance(v, int) else f"{v:.{digits}g}"


def page(title: str, source: Source, body: str, *, fragment: bool) -> str:
    if fragment:
        return body
    crumbs = f'<p class="muted"><a href="/">{esc(source.uri)}</a> · read only · updates every {POLL_MS // 1000} s</p>'
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} · tracefleet</title>"
            f"<style>{_CSS}</style></head><body><h1>{esc(title)}</h1>{crumbs}<div id='live'>{body}</div>{_SCRIPT}"
            "</body></html>\n")


def cards(items: list[tuple[str, str, Any]]) -> str:
    return "<div class='cards'>" + "".join(
        f"<div class='card'><b data-count='{key}'>{esc(num(value))}</b>{esc(label)}</div>" for key, label, value in items
    ) + "</div>"


def table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    if not rows:
        return "<p class='muted'>none</p>"
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><tr>{th}</tr>{body}</table>"


# ---- the overview ------------------------------------------------------------------------------------------

def overview(source: Source, *, fragment: bool = False) -> str:
    rows = []
    for path, job in sorted(source.jobs.items()):
        f = fig.job_figures([job.manifests[s] for s in sorted(job.manifests)])
        p = job.progress
        rows.append([link("/job", path, path=path), esc(_state(p)), f"<span class='num'>{num(p.counters.running if p else None)}</span>",
                     esc(_eta(p)), *(f"<span class='num'>{num(v)}</span>" for v in (
            f.batches, f.sessions, f.traces, f.tokens, f.trainable_tokens, f.fail_closed, f.quarantined,
            f.reward_mean[-1] if f.reward_mean else None)), esc(_ago(f.last_sealed_at))])
    body = "<h2>Jobs</h2>" + table(["job", "sessions finished", "running", "ETA", "batches", "sessions", "traces", "tokens", "trainable", "fail-closed",
                                    "quarantined", "last batch reward", "last sealed"], rows)
    loops = sorted(source.loops.items())
    if loops:
        lrows = []
        series: dict[str, list[float | None]] = {}
        longest = 0
        for path, loop in loops:
            steps = loop.steps()
            last = steps[-1] if steps else {}
            lrows.append([link("/loop", path or ".", path=path), f"<span class='num'>{len(steps)}</span>",
                          esc(num(last.get("reward_mean"))), esc(num(last.get("mean_abs_dlogprob"))),
                          esc(num(last.get("sync_s")))])
            series[path or "."] = fig.loop_series(steps)["reward_mean"]
            longest = max(longest, len(steps))
        body += "<h2>Training loops</h2>" + table(["run", "steps", "last reward", "last mismatch", "last sync s"], lrows)
        padded = {k: v + [None] * (longest - len(v)) for k, v in series.items()}
        body += "<div class='charts'>" + line_chart("chart-loops-reward", "mean reward per step, every loop",
                                                    list(range(1, longest + 1)), padded, x_title="step") + "</div>"
        if len(loops) >= 2:
            a, b = loops[-2][0], loops[-1][0]
            body += f"<p>{link('/compare', 'compare two runs', a=a, b=b)}</p>"
    if not source.jobs and not source.loops:
        body += f"<p class='muted' data-empty='1'>nothing sealed under {esc(source.uri)} yet: this page fills in as batches land</p>"
    return page("tracefleet dashboard", source, body, fragment=fragment)


def _state(p: JobProgress | None) -> str:
    """Sessions finished of the job's, as its driver last wrote (– when it writes none)."""
    if p is None:
        return "–"
    c = p.counters
    return f"{c.finished:,} / {c.total:,}" + (" (done)" if p.finished else "")


def _eta(p: JobProgress | None) -> str:
    if p is None:
        return "–"
    if p.finished:
        return "done"
    eta = p.eta_now_s()
    return "–" if eta is None else _duration(eta)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def progress_section(p: JobProgress | None) -> str:
    """The running count and ETA (<job>/progress.json): what the job's driver knows and no sealed batch holds."""
    if p is None:
        return "<p class='muted' data-progress='none'>no progress written for this job (its driver writes none)</p>"
    c = p.counters
    body = cards([("finished", "sessions finished", c.finished), ("total", "sessions in this run", c.total),
                  ("running", "running now", c.running), ("pending", "not started", c.pending),
                  ("calls", "model calls", p.calls)])
    age = _ago(p.updated_at.timestamp())
    state = "finished" if p.finished else "running"
    return body + (f"<p data-progress='{state}'>ETA <b data-eta='{esc(_eta(p))}'>{esc(_eta(p))}</b> · {esc(p.driver)} "
                   f"driver · started {esc(_ago(p.started_at.timestamp()))}, last written {esc(age)}"
                   + (f" · {p.skipped:,} sessions sealed by an earlier run" if p.skipped else "") + "</p>")


def _ago(t: float) -> str:
    if not t:
        return "–"
    return f"{_duration(max(0, time.time() - t))} ago"


# ---- a job -------------------------------------------------------------------------------------------------

def job_page(source: Source, job: JobSource, *, fragment: bool = False) -> str:
    manifests = [job.manifests[s] for s in sorted(job.manifests)]
    f = fig.job_figures(manifests)
    rows_by_seq = dict(job.rows)
    waiting = max(0, job.finished - f.sessions) if job.finished is not None else None
    body = "<h2>Progress</h2>" + progress_section(job.progress) + "<h2>Sealed</h2>" + cards([("batches", "batches", f.batches), ("sessions", "sessions sealed", f.sessions),
                  ("waiting", "finished, not yet sealed", waiting),
                  ("failed", "sessions failed (fail-closed)", f.fail_closed), ("traces", "traces", f.traces),
                  ("tokens", "tokens", f.tokens), ("trainable", "trainable tokens", f.trainable_tokens),
                  ("quarantined", "sessions quarantined", f.quarantined), ("rows-read", "batches' rows read", len(rows_by_seq))])
    if job.listed > f.batches:
        body += f"<p class='muted' data-reading='1'>reading manifests: {f.batches:,} of {job.listed:,} batches so far</p>"
    signal = [fig.signal_share(rows_by_seq[s]) if s in rows_by_seq else None for s in f.seqs]
    body += "<h2>Curves</h2><div class='charts'>"
    body += line_chart("chart-reward", "mean reward per batch", f.seqs, {"reward": f.reward_mean}, x_title="batch")
    body += line_chart("chart-signal", "share of groups with signal per batch", f.seqs, {"signal": signal},
                       x_title="batch", y_range=(0, 1))
    tasks = fig.task_success(rows_by_seq, f.seqs)
    charted = dict(list(tasks.items())[:TASKS_CHARTED])
    body += line_chart("chart-tasks", "per task success (share of sessions with reward > 0)", f.seqs, charted,
                       x_title="batch", y_range=(0, 1))
    body += "</div>"
    reasons = fig.fail_closed_reasons(rows_by_seq)
    body += "<h2>Fail-closed reasons</h2>" + table(["reason", "sessions"], [[esc(k), str(v)] for k, v in reasons.most_common()])
    body += "<h2>Diagnostics</h2>" + table(
        ["diagnostic", "findings", "sessions quarantined"],
        [[esc(k), str(f.findings[k]), str(f.quarantines[k])] for k in sorted(f.findings)])
    newest: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for seq in sorted(rows_by_seq, reverse=True):
        for s in fig.sessions_of(rows_by_seq[seq]).values():
            if len(newest) < SESSIONS_SHOWN:
                newest.append(s)
            if len(failed) < SESSIONS_SHOWN and (s.get("outcome") != "ok" or s.get("quarantined")):
                failed.append(s)
    head = ["batch", "session", "task", "reward", "outcome", "fail-closed", "findings", "traces"]
    body += f"<h2>Failed or quarantined sessions (newest {SESSIONS_SHOWN})</h2>" + table(head, _session_rows(job, failed), "failed")
    body += f"<h2>Sessions (newest {SESSIONS_SHOWN})</h2>" + table(head, _session_rows(job, newest), "sessions")
    return page(f"job {job.path}", source, body, fragment=fragment)


def _session_rows(job: JobSource, sessions: list[dict[str, Any]]) -> list[list[str]]:
    return [[str(s["seq"]), link("/session", s["session_id"], path=job.path, session=s["session_id"]),
             esc(s.get("task_id")), esc(num(s.get("reward"))), esc(s.get("outcome")),
             esc(", ".join(s.get("fail_closed_reasons") or ())), str(len(s.get("diagnostics") or ())),
             str(len(s["traces"]))] for s in sessions]


def session_page(source: Source, job: JobSource, session_id: str, *, fragment: bool = False) -> str:
    rows = [r for seq in sorted(job.rows) for r in job.rows[seq] if r["session_id"] == session_id]
    if not rows:
        return page(f"session {session_id}", source, "<p class='muted'>not in a sealed batch read yet</p>", fragment=fragment)
    first = rows[0]
    body = table(["", ""], [[esc(k), esc(v)] for k, v in (
        ("job", job.path), ("batch", first["seq"]), ("task", first.get("task_id")), ("group", first.get("group_id")),
        ("reward", first.get("reward")), ("evaluator reward", first.get("evaluator_reward")),
        ("outcome", first.get("outcome")), ("fail-closed", ", ".join(first.get("fail_closed_reasons") or ()) or "–"),
        ("quarantined", first.get("quarantined")))])
    body += "<h2>Traces</h2>" + table(["trace", "tokens", "trainable", "new root"], [
        [link("/trace", r["trace_id"], path=job.path, seq=r["seq"], trace=r["trace_id"]), num(r.get("num_tokens")),
         num(r.get("num_trainable")), esc(r.get("new_root_reason"))] for r in rows], "traces")
    findings = first.get("diagnostics") or []
    body += "<h2>Findings</h2>" + table(["diagnostic", "severity", "action", "where", "message"], [
        [esc(d.get("name")), esc(d.get("severity")), esc(d.get("action")),
         esc(":".join(str(x) for x in (d.get("file"), d.get("line")) if x)), esc(d.get("message"))] for d in findings])
    evidence = job.evidence(session_id)
    if evidence is None:
        body += "<p class='muted'>no evidence kept for this session</p>"
    else:
        h, ev = evidence.get("harness") or {}, evidence.get("evaluator") or {}
        body += "<h2>Harness</h2>" + table(["status", "stage", "exit code", "error"], [[
            esc(h.get("status")), esc(h.get("stage")), esc(h.get("exit_code")), esc(h.get("error"))]])
        if h.get("stderr_tail"):
            body += f"<pre class='stderr'>{esc(h['stderr_tail'])}</pre>"
        body += "<h2>Evaluator</h2>" + table(["status", "reward", "exit code", "message"], [[
            esc(ev.get("status")), esc(ev.get("reward")), esc(ev.get("exit_code")), esc(ev.get("message"))]])
        body += f"<pre class='evaluator'>{esc(ev.get('output_tail') or '(no output)')}</pre>"
        if evidence.get("patch"):
            body += f"<h2>Patch</h2><pre class='patch'>{esc(evidence['patch'])}</pre>"
    return page(f"session {session_id}", source, body, fragment=fragment)


# ---- a loop ------------------------------------------------------------------------------------------------

def loop_page(source: Source, loop: LoopSource, *, fragment: bool = False) -> str:
    steps = loop.steps()
    series = fig.loop_series(steps)
    x = [s.get("step", i + 1) for i, s in enumerate(steps)]
    last = steps[-1] if steps else {}
    body = cards([("steps", "steps", len(steps)), ("version", "policy version", last.get("version")),
                  ("reward", "last batch reward", last.get("reward_mean"))])
    held = _held_out(source, loop)
    if held:
        body += "<h2>Held-out reward</h2>" + table(["when", "sessions", "mean reward"], held, "held-out")
    body += "<h2>Per step</h2><div class='charts'>"
    for key, title in fig.LOOP_FIGURES:
        body += line_chart(f"chart-{key}", title, x, {key: series[key]}, x_title="step")
    body += "</div><h2>Jobs</h2>" + "".join(f"<p>{link('/job', p, path=p)}</p>" for p in loop.jobs)
    return page(f"loop {loop.path or '.'}", source, body, fragment=fragment)


def _held_out(source: Source, loop: LoopSource) -> list[list[str]]:
    out = []
    for path, job in sorted(source.jobs.items()):
        rest = path[len(loop.path):].lstrip("/") if path.startswith(loop.path) else ""
        if rest.startswith("held-out-"):
            ms = [job.manifests[s] for s in sorted(job.manifests)]
            n = sum(m.reward.sessions for m in ms)
            mean = sum((m.reward.mean or 0) * m.reward.sessions for m in ms) / n if n else None
            out.append([esc(rest.split("/")[0].removeprefix("held-out-")), str(n), esc(num(mean))])
    return out


def compare_page(source: Source, a: LoopSource, b: LoopSource, *, fragment: bool = False) -> str:
    sa, sb = fig.loop_series(a.steps()), fig.loop_series(b.steps())
    n = max(len(sa["reward_mean"]), len(sb["reward_mean"]))
    body = "<div class='charts'>"
    for key, title in fig.LOOP_FIGURES:
        pad = lambda v: v + [None] * (n - len(v))  # noqa: E731
        body += line_chart(f"chart-{key}", title, list(range(1, n + 1)),
                           {a.path or ".": pad(sa[key]), b.path or ".": pad(sb[key])}, x_title="step")
    return page(f"compare {a.path or '.'} and {b.path or '.'}", source, body + "</div>", fragment=fragment)
