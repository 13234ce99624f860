"""`tracefleet diagnose --html PATH`: one self-contained page (inline CSS, no script, no remote asset)
with the backtest's per-diagnostic summary and, for each flagged session, the evidence a person needs to
check each finding: the findings, the diff lines around each finding's file:line, the model calls a
finding names (text, tool calls, finish reason), the evaluator's output tail and the harness's stderr
tail. Everything taken from a session is HTML-escaped: a diff may hold any text a policy wrote.
"""

from __future__ import annotations

import json
from html import escape

from tracefleet.diagnostics.backtest import Backtest, DiagnosticReport, mean_text
from tracefleet.diagnostics.base import Finding
from tracefleet.diagnostics.evidence import _DIFF_HEADER, _HUNK, SessionEvidence

CONTEXT_LINES = 3  # diff lines shown either side of a finding's line
WHOLE_FILE_LINES = 40  # a finding without a line (a deleted or renamed file): the start of its diff

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:.5em;overflow-x:auto;white-space:pre-wrap;margin:.3em 0}
.add{background:#e6ffec}.del{background:#ffebe9}.hit{outline:2px solid #d1242f}
section{border-top:2px solid #888;margin-top:1.5em}h3{margin:.6em 0 .3em}.muted{color:#666}
"""


def _pre(text: str | None, empty: str = "(empty)") -> str:
    return f"<pre>{escape(text)}</pre>" if text else f'<p class="muted">{escape(empty)}</p>'


def diff_lines(patch: str, path: str) -> list[tuple[int | None, str]]:
    """`path`'s part of a `git diff`: (line number in the new file, or None for a removed or header
    line; the raw diff line)."""
    out: list[tuple[int | None, str]] = []
    inside = in_hunk = False
    line_no = 0
    for raw in patch.splitlines():
        header = _DIFF_HEADER.match(raw)
        if header:
            inside, in_hunk = path in (header.group(1), header.group(2)), False
            continue
        if not inside:
            continue
        hunk = _HUNK.match(raw)
        if hunk:
            in_hunk, line_no = True, int(hunk.group(1))
            out.append((None, raw))
        elif not in_hunk or raw.startswith(("-", "\\")):
            out.append((None, raw))
        else:
            out.append((line_no, raw))
            line_no += 1
    return out


def diff_excerpt(patch: str, path: str, line: int | None) -> str:
    """The diff lines around `line` of `path` as HTML (the finding's line outlined)."""
    lines = diff_lines(patch, path)
    if not lines:
        return ""
    at = next((i for i, (n, _) in enumerate(lines) if n == line), None) if line is not None else None
    window = lines[max(0, at - CONTEXT_LINES): at + CONTEXT_LINES + 1] if at is not None else lines[:WHOLE_FILE_LINES]
    rows = []
    for n, raw in window:
        css = "add" if raw.startswith("+") else "del" if raw.startswith("-") else ""
        if n is not None and n == line:
            css += " hit"
        number = "" if n is None else str(n)
        rows.append(f'<span class="{css.strip()}">{escape(f"{number:>5} {raw}")}</span>')
    return "<pre>" + "\n".join(rows) + "</pre>"


def _call(ev: SessionEvidence, call_id: str) -> str:
    call = next((c for c in ev.calls if c.call_id == call_id), None)
    if call is None:
        return f'<p class="muted">call {escape(call_id)} is not in the evidence</p>'
    head = (f"call {call.call_id} (#{call.index}): status {call.status}, finish reason {call.finish_reason}, "
            f"policy {call.policy_version}, {call.completion_tokens} completion tokens")
    parts = [f"<p>{escape(head)}</p>", _pre(call.text, "(no text)")]
    if call.tool_calls:
        parts.append(_pre(json.dumps(call.tool_calls, indent=1, ensure_ascii=False)))
    if call.tool_parse_errors:
        parts.append(_pre("\n".join(call.tool_parse_errors)))
    return "".join(parts)


def _finding(ev: SessionEvidence, f: Finding) -> str:
    where = ", ".join(x for x in (f"{f.file}:{f.line}" if f.file and f.line else f.file,
                                  f"call {f.call_id}" if f.call_id else None) if x)
    parts = [f"<h4>{escape(f'{f.name} v{f.version} [{f.severity}] ({f.action})')}: {escape(f.message)}</h4>",
             f"<p>evidence: {escape(where)}</p>"]
    if f.file:
        parts.append(diff_excerpt(ev.patch, f.file, f.line))
    if f.call_id:
        parts.append(_call(ev, f.call_id))
    return "".join(parts)


def _summary(reports: list[DiagnosticReport]) -> str:
    head = ("diagnostic", "version", "flagged", "judged", "mean reward flagged", "mean reward not",
            "positive-advantage demoted", "their advantage", "mean |advantage change| of the others")
    rows = [(r.name, r.version, len(r.flagged), r.sessions, mean_text(r.flagged_rewards), mean_text(r.other_rewards), r.demoted,
             f"{r.demoted_advantage:+.3f}", mean_text(r.changes)) for r in reports]
    return ("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def backtest_page(job: str, result: Backtest) -> str:
    flagged: dict[str, list[Finding]] = {}
    for report in result.reports:
        for sid in report.flagged:
            flagged.setdefault(sid, []).extend(report.findings[sid])
    sections = []
    for sid, findings in flagged.items():
        ev = result.evidence[sid]
        head = (f"task {ev.task_id}, group {ev.group_id}, sample {ev.sample_index}; sealed reward "
                f"{result.rewards.get(sid)}, evaluator {ev.evaluator.status} {ev.evaluator.reward}, "
                f"advantage {result.advantages.get(sid, 0.0):+.3f}; harness {ev.harness.status} exit {ev.harness.exit_code}")
        sections.append(
            f'<section id="{escape(sid)}"><h3>{escape(sid)}</h3><p>{escape(head)}</p>'
            + "".join(_finding(ev, f) for f in findings)
            + f"<h4>evaluator output (tail, exit {escape(str(ev.evaluator.exit_code))})</h4>{_pre(ev.evaluator.output_tail)}"
            + f"<h4>harness stderr (tail)</h4>{_pre(ev.harness.stderr_tail)}</section>")
    index = "".join(f'<li><a href="#{escape(s)}">{escape(s)}</a> ({escape(", ".join(sorted({f.name for f in fs})))})</li>'
                    for s, fs in flagged.items())
    title = f"tracefleet diagnose: {job}"
    summary = (f"{result.sessions} sealed sessions in {len(result.seqs)} batches"
               + (f", {result.missing} without evidence (not judged)" if result.missing else ""))
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>'
            f"<body><h1>{escape(title)}</h1><p>{escape(summary)}</p>{_summary(result.reports)}"
            f"<h2>flagged sessions ({len(flagged)})</h2><ul>{index}</ul>{''.join(sections)}</body></html>\n")

