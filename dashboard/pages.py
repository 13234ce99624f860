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

from tracefleet.contract.semantics import OutcomeKind, outcome_counts
from tracefleet.dashboard import figures as fig
from tracefleet.dashboard.charts import line_chart
from tracefleet.contract.progress import STALE_AFTER_HEARTBEATS, JobProgress, ProgressState, progress_state
from tracefleet.dashboard.source import JobSource, LoopSource, Source

POLL_MS = 2000
KIND_WORDS = {OutcomeKind.OK: "ok", OutcomeKind.POLICY: "the policy's", OutcomeKind.INFRASTRUCTURE: "the infrastructure's"}
SESSIONS_SHOWN = 100  # the newest sessions a job page lists
TASKS_CHARTED = 12
BATCHES_SHOWN = 200  # the newest batches the per-batch table lists
GROUPS_SHOWN = 50  # the newest groups the job page lists

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
function duration(s) {
  return s < 120 ? Math.round(s) + " s" : s < 7200 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
}
// relative times tick between refreshes: the server wrote their instants (epoch seconds), not their text
function clock() {
  const now = Date.now() / 1000;
  for (const e of document.querySelectorAll("[data-ago]")) e.textContent = duration(Math.max(0, now - Number(e.dataset.ago))) + " ago";
  for (const e of document.querySelectorAll("[data-until]")) {
    const left = duration(Math.max(0, Number(e.dataset.until) - now));
    e.textContent = left;
    e.dataset.eta = left;
  }
}
tick();
setInterval(clock, 1000);
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
        try:
            rows.append(_job_row(path, job))
        except Exception as exc:  # noqa: BLE001 - what one job holds never takes the page of every job down
            rows.append([link("/job", path, path=path), f"<span class='bad' data-unreadable='1'>unreadable: {esc(exc)}</span>"])
    body = "<h2>Jobs</h2>" + table(["job", "sessions finished", "state", "running", "ETA", "batches", "sessions", "ok",
                                    "the policy's failures", "the infrastructure's", "quarantined", "mean reward",
                                    "success rate", "traces", "tokens", "trainable", "last sealed"], rows, "jobs")
    loops = sorted(source.loops.items())
    if loops:
        lrows = []
        series: dict[str, list[float | None]] = {}
        longest = 0
        for path, loop in loops:
            steps = loop.steps()
            last = steps[-1] if steps else {}
            lrows.append([link("/loop", path or ".", path=path), f"<span class='num'>{len(steps)}</span>"
                          + _bad_lines(loop), *(esc(num(fig.figure(last.get(k)))) for k in ("reward_mean", "mean_abs_dlogprob", "sync_s"))])
            series[path or "."] = fig.loop_series(steps)["reward_mean"]
            longest = max(longest, len(steps))
        body += "<h2>Training loops</h2>" + table(["run", "steps", "last reward", "last mismatch", "last sync s"], lrows)
        padded = {k: v + [None] * (longest - len(v)) for k, v in series.items()}
        body += "<div class='charts'>" + line_chart("chart-loops-reward", "mean reward per step, every loop",
                                                    list(range(1, longest + 1)), padded, x_title="step") + "</div>"
        if len(loops) >= 2:
            a, b = loops[-2][0], loops[-1][0]
            body += f"<p>{link('/compare', 'compare two runs', a=a, b=b)}</p>"
    if source.problem:
        body = f"<p class='bad' data-problem='1'>cannot read {esc(source.uri)} now ({esc(source.problem)}): showing what was read before</p>" + body
    if not source.jobs and not source.loops:
        why = f" ({esc(source.missing)})" if source.missing else ""
        body += f"<p class='muted' data-empty='1'>nothing sealed under {esc(source.uri)} yet{why}: this page fills in as batches land</p>"
    return page("tracefleet dashboard", source, body, fragment=fragment)


def _job_row(path: str, job: JobSource) -> list[str]:
    """A job's row: what its driver last wrote, what its sealed batches hold; what does not read, said in it."""
    f = fig.job_figures([job.manifests[s] for s in sorted(job.manifests)])
    p = job.progress
    state = progress_state(p) if p else None
    problems = ([f"progress.json unreadable: {job.progress_error}"] if job.progress_error else []) + [
        f"batch {seq}: manifest unreadable: {why}" for seq, why in sorted(job.bad_manifests.items())]
    cell = _state_cell(state) + "".join(f"<div class='bad' data-unreadable='1'>{esc(x)}</div>" for x in problems[:3])
    o = f.outcomes
    return [link("/job", path, path=path), _finished(p), cell, f"<span class='num'>{num(_running(p, state))}</span>",
            _eta(p, state), *(f"<span class='num'>{num(v)}</span>" for v in (
                f.batches, f.sessions, o.ok if o else None, o.policy if o else None, o.infrastructure if o else None,
                f.quarantined, f.mean_reward, f.success_rate, f.traces, f.tokens, f.trainable_tokens)), _ago(f.last_sealed_at)]


def _finished(p: JobProgress | None) -> str:
    """Sessions finished of the job's, as its driver last wrote (– when it writes none)."""
    return "–" if p is None else f"{p.counters.finished:,} / {p.counters.total:,}"


def _state_cell(state: ProgressState | None) -> str:
    """The job's state as its progress says (running, done, interrupted, stale, stopped), `data-state` its kind."""
    if state is None:
        return "–"
    cls = " class='bad'" if state.kind in ("stale", "stopped") else ""
    return f"<span data-state='{state.kind}'{cls}>{esc(state.words())}</span>"


def _running(p: JobProgress | None, state: ProgressState | None) -> int | None:
    """Sessions running now: none once its driver is gone (the record's count is what it was when it last wrote)."""
    if p is None or state is None:
        return None
    return p.counters.running if state.kind in ("running", "stale") else 0


def _eta(p: JobProgress | None, state: ProgressState | None) -> str:
    """The ETA, counted down in the page (`data-until`); the state instead of one when the job is not running."""
    if p is None or state is None:
        return "–"
    if state.kind != "running":
        word = "done" if state.kind == "done" else state.kind
        return f"<span data-eta='{word}'>{word}</span>"
    eta = p.eta_now_s()
    if eta is None:
        return "<span data-eta='–'>–</span>"
    return f"<span data-eta='{esc(_duration(eta))}' data-until='{time.time() + eta:.0f}'>{esc(_duration(eta))}</span>"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def progress_section(p: JobProgress | None, error: str | None = None) -> str:
    """The running count and ETA (<job>/progress.json): what the job's driver knows and no sealed batch holds."""
    if p is None:
        if error:
            return f"<p class='bad' data-progress='unreadable'>progress.json unreadable: {esc(error)}</p>"
        return "<p class='muted' data-progress='none'>no progress written for this job (its driver writes none)</p>"
    c = p.counters
    state = progress_state(p)
    body = cards([("finished", "sessions finished", c.finished), ("total", "sessions in this run", c.total),
                  ("running", "running now", _running(p, state)),
                  ("pending", "never started" if state.kind == "interrupted" else "not started", c.pending),
                  ("calls", "model calls", p.calls)])
    line = (f"<p data-progress='{state.kind}'>{_state_cell(state)} · ETA <b>{_eta(p, state)}</b> · {esc(p.driver)} "
            f"driver · started {_ago(p.started_at.timestamp())}, last written {_ago(p.updated_at.timestamp())}"
            + (f" · {p.skipped:,} sessions sealed by an earlier run" if p.skipped else "") + "</p>")
    if state.kind == "stopped":
        line += ("<p class='bad'>its driver's process is gone without having written its end (killed?): "
                 "what it had sealed is kept; running the job again continues it</p>")
    elif state.kind == "stale":
        line += (f"<p class='bad'>its driver has not written for over {STALE_AFTER_HEARTBEATS} heartbeats of "
                 f"{p.heartbeat_s:g} s: stopped, stuck, or unable to reach the bucket</p>")
    return body + line


def _ago(t: float) -> str:
    """A relative time that the page's clock keeps ticking."""
    if not t:
        return "–"
    return f"<span data-ago='{t:.0f}'>{esc(_duration(max(0, time.time() - t)))} ago</span>"


# ---- a job -------------------------------------------------------------------------------------------------

def job_page(source: Source, job: JobSource, *, fragment: bool = False) -> str:
    manifests = [job.manifests[s] for s in sorted(job.manifests)]
    f = fig.job_figures(manifests)
    rows_by_seq = dict(job.rows)
    waiting = max(0, job.finished - f.sessions) if job.finished is not None else None
    o = f.outcomes
    body = "<h2>Progress</h2>" + progress_section(job.progress, job.progress_error) + "<h2>Sealed</h2>" + cards([
        ("batches", "batches", f.batches), ("sessions", "sessions sealed", f.sessions),
        ("waiting", "finished, not yet sealed", waiting),
        ("ok", "ok", o.ok if o else None), ("policy", "the policy's failures", o.policy if o else None),
        ("infrastructure", "the infrastructure's (left out of training)", o.infrastructure if o else None),
        ("failed", "sessions failed (fail-closed)", f.fail_closed),
        ("mean-reward", "mean reward", f.mean_reward), ("success-rate", "success rate (reward > 0)", f.success_rate),
        ("traces", "traces", f.traces), ("tokens", "tokens", f.tokens), ("trainable", "trainable tokens", f.trainable_tokens),
        ("quarantined", "sessions quarantined", f.quarantined), ("rows-read", "batches' rows read", len(rows_by_seq))])
    reading = job.listed - f.batches - len(job.bad_manifests)
    if reading > 0:
        body += f"<p class='muted' data-reading='1'>reading manifests: {f.batches:,} of {job.listed - len(job.bad_manifests):,} batches so far</p>"
    for seq, why in sorted(job.bad_manifests.items()):
        body += f"<p class='bad' data-unreadable='manifest'>batch {seq}: manifest unreadable, left out: {esc(why)}</p>"
    for seq, why in sorted(job.bad_rows.items()):
        body += f"<p class='bad' data-unreadable='rows'>batch {seq}: rows unreadable: {esc(why)}</p>"
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
    body += "<h2>Batches</h2>" + _batch_table(job, rows_by_seq)
    groups = fig.group_spread(rows_by_seq)
    with_signal = sum(1 for g in groups if g.signal)
    body += (f"<h2>Groups</h2><p><span data-count='groups-with-signal'>{with_signal:,}</span> of "
             f"<span data-count='groups-read'>{len(groups):,}</span> groups read have a reward spread (their GRPO "
             f"advantages are not all 0); the infrastructure's sessions are left out of their group's statistics</p>")
    body += table(["batch", "group", "task", "sessions", "rewards", "spread (std)"], [
        [str(g.seq), esc(g.group_id), esc(g.task_id), str(g.sessions), esc(" ".join(num(r, 2) for r in g.rewards)),
         esc(num(g.std))] for g in groups[-GROUPS_SHOWN:][::-1]], "groups")
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
    head = ["batch", "session", "task", "reward", "outcome", "whose", "fail-closed", "findings", "traces"]
    body += f"<h2>Failed or quarantined sessions (newest {SESSIONS_SHOWN})</h2>" + table(head, _session_rows(job, failed), "failed")
    body += f"<h2>Sessions (newest {SESSIONS_SHOWN})</h2>" + table(head, _session_rows(job, newest), "sessions")
    return page(f"job {job.path}", source, body, fragment=fragment)


def _kind(session: dict[str, Any]) -> str:
    """Whose outcome a sealed session is, in words (– for a batch sealed before outcome kinds)."""
    kind = session.get("outcome_kind")
    return KIND_WORDS.get(kind, kind) if kind else "–"


def _batch_table(job: JobSource, rows_by_seq: dict[int, list[dict[str, Any]]]) -> str:
    """One row per sealed batch, newest first: its sessions by outcome kind, reward, success, groups with signal."""
    out = []
    for seq in sorted(job.manifests, reverse=True)[:BATCHES_SHOWN]:
        m = job.manifests[seq]
        o = outcome_counts(m) if m.outcome_kinds else None
        signal = fig.signal_share(rows_by_seq[seq]) if seq in rows_by_seq else None
        out.append([str(seq), *(f"<span class='num'>{num(v)}</span>" for v in (
            m.sessions, o.ok if o else None, o.policy if o else None, o.infrastructure if o else None,
            m.quarantined_sessions, m.reward.mean, m.reward.positive / m.sessions if m.sessions else None,
            m.groups, signal, m.tokens, m.trainable_tokens)), _ago(m.created_at)])
    return table(["batch", "sessions", "ok", "the policy's", "the infrastructure's", "quarantined", "mean reward",
                  "success rate", "groups", "share with signal", "tokens", "trainable", "sealed"], out, "batches")


def _session_rows(job: JobSource, sessions: list[dict[str, Any]]) -> list[list[str]]:
    return [[str(s["seq"]), link("/session", s["session_id"], path=job.path, session=s["session_id"]),
             esc(s.get("task_id")), esc(num(s.get("reward"))), esc(s.get("outcome")), esc(_kind(s)),
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
        ("outcome", first.get("outcome")), ("whose outcome", _kind(first)), ("fail-closed", ", ".join(first.get("fail_closed_reasons") or ()) or "–"),
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
    x = [_step(s, i) for i, s in enumerate(steps)]
    last = steps[-1] if steps else {}
    body = cards([("steps", "steps", len(steps)), ("version", "policy version", fig.figure(last.get("version"))),
                  ("reward", "last batch reward", fig.figure(last.get("reward_mean")))]) + _bad_lines(loop)
    held = _held_out(source, loop)
    if held:
        body += "<h2>Held-out reward</h2>" + table(["when", "sessions", "mean reward"], held, "held-out")
    body += "<h2>Per step</h2><div class='charts'>"
    for key, title in fig.LOOP_FIGURES:
        body += line_chart(f"chart-{key}", title, x, {key: series[key]}, x_title="step")
    body += "</div><h2>Jobs</h2>" + "".join(f"<p>{link('/job', p, path=p)}</p>" for p in loop.jobs)
    return page(f"loop {loop.path or '.'}", source, body, fragment=fragment)


def _step(step: dict[str, Any], i: int) -> float:
    n = fig.figure(step.get("step"))
    return i + 1 if n is None else n


def _bad_lines(loop: LoopSource) -> str:
    """The loop.jsonl lines that do not read, said on the loop's own row and page (its other steps are shown)."""
    if not loop.bad_lines:
        return ""
    return (f"<p class='bad' data-bad-lines='{len(loop.bad_lines)}'>{len(loop.bad_lines):,} line(s) of loop.jsonl "
            f"unreadable, left out (the first, {esc(loop.bad_lines[0])})</p>")


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
