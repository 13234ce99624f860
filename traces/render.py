"""Render a trace for a human: the terminal (ANSI) and a standalone HTML page.

Trainable tokens (sampled by the policy, loss_mask = 1) are green; context tokens are dim/grey. Each call's
span starts with a marker naming the call, its policy version and finish reason. Long context runs are
elided in the middle (`max_context`), never the trainable spans (up to `max_tokens` in all).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable

import numpy as np

from tracefleet.contract.semantics import OUTCOME_KIND_MEANING, OUTCOME_KIND_WORDS
from tracefleet.traces.schema import Trace

Decoder = Callable[[list[int]], list[str]]


def ids_decoder(ids: list[int]) -> list[str]:
    return [f"{i} " for i in ids]


def tokenizer_decoder(ref: str) -> Decoder:
    """Per-token text with the tokenizer `ref` names: a shipped model (`smollm2`, `gemma3-270m`), a .gguf
    file, a Hugging Face model directory or hub id in the local cache, or a tokenizer.json
    (`tracefleet.formats.families.load_tokenizer`). A character split over several tokens is shown once,
    at the token that completes it, so a run of tokens reads as the text the model wrote."""
    from tracefleet.formats.families import load_tokenizer
    from tracefleet.formats.tokenizer import IncrementalDetokenizer

    tok = load_tokenizer(ref)

    def decode(ids: list[int]) -> list[str]:
        detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
        texts = [detok.push(i) for i in ids]
        if texts:
            texts[-1] += detok.flush()
        return texts

    return decode


def trace_decoder(refs: list[str | None]) -> tuple[Decoder, str | None, str | None]:
    """(decoder, the ref that resolved, why none did) for the first of `refs` (the trace's tokenizer,
    its model, ...) whose tokenizer is on this machine; token ids when none is."""
    tried: list[str] = []
    for ref in dict.fromkeys(r for r in refs if r):
        try:
            return tokenizer_decoder(ref), ref, None
        except Exception as exc:  # noqa: BLE001 - any loader failure means: not this one, try the next
            tried.append(f"{ref!r} ({exc})")
    return ids_decoder, None, ("no tokenizer found for " + "; ".join(tried)) if tried else "the trace names no model"


def _segments(trace: Trace, max_context: int) -> list[tuple[str, str, list[int], list[float]]]:
    """(kind, label, ids, logprobs) pieces in order: kind is context | sampled | elided | marker."""
    out: list[tuple[str, str, list[int], list[float]]] = []
    for span in trace.spans:
        ctx = trace.tokens[span.prompt_start : span.completion_start].tolist()
        if len(ctx) > max_context > 0:
            head, tail = ctx[: max_context // 2], ctx[-(max_context - max_context // 2) :]
            out.append(("context", "", head, []))
            out.append(("elided", f" [… {len(ctx) - len(head) - len(tail):,} context tokens …] ", [], []))
            out.append(("context", "", tail, []))
        elif ctx:
            out.append(("context", "", ctx, []))
        label = f"call {span.call_id} · policy v{span.policy_version} · {span.finish_reason or '-'}"
        out.append(("marker", label, [], []))
        lp = trace.logprobs[span.completion_start : span.completion_end]
        out.append(("sampled", "", trace.tokens[span.completion_start : span.completion_end].tolist(), lp.tolist()))
    return out


def _header(trace: Trace) -> list[tuple[str, str]]:
    m = trace.meta
    st = m.stats
    rows = [
        ("trace", m.trace_id),
        ("job / session", f"{m.job or '-'} / {m.session_id}"),
        ("task / group / sample", f"{m.task_id or '-'} / {m.group_id or '-'} / {m.sample_index if m.sample_index is not None else '-'}"),
        ("harness / model", f"{m.harness or '-'} / {m.model or '-'}"),
        ("reward", f"{m.reward} (evaluator: {m.evaluator_reward})"),
        ("outcome", f"{OUTCOME_KIND_WORDS[m.outcome_kind]} ({OUTCOME_KIND_MEANING[m.outcome_kind]}): {m.outcome}"
                    + (f" ({', '.join(m.fail_closed_reasons)})" if m.fail_closed_reasons else "")),
        ("builder", m.builder + (f", branch of {m.branch_of}" if m.branch_of else "") + (f", new root: {m.new_root_reason}" if m.new_root_reason else "")),
        ("tokens", f"{trace.num_tokens:,} ({trace.num_trainable:,} trainable) in {len(trace.spans)} call(s)"),
        ("policy versions", ", ".join(str(v) for v in trace.policy_versions)),
        (
            "session stats",
            f"calls {st.calls}, traces {st.traces}, merged {st.merged_calls}, retries {st.retries}, "
            f"branches {st.branches}, drift splits {st.drift_splits}, ambiguous {st.ambiguous}, "
            f"dropped {json.dumps(st.dropped) if st.dropped else 0}",
        ),
    ]
    return rows


def render_terminal(trace: Trace, *, decode: Decoder = ids_decoder, color: bool = True, max_context: int = 64,
                    max_tokens: int = 4000) -> str:
    dim, green, bold, yellow, reset = ("\x1b[2m", "\x1b[32m", "\x1b[1m", "\x1b[33m", "\x1b[0m") if color else ("",) * 5
    lines = [f"{bold}{k:>22}{reset}  {v}" for k, v in _header(trace)]
    lines.append("")
    body: list[str] = []
    budget = max_tokens
    for kind, label, ids, _ in _segments(trace, max_context):
        if budget <= 0:
            body.append(f"{yellow}… output truncated (--max-tokens){reset}")
            break
        if kind == "marker":
            body.append(f"\n{yellow}▌{label}{reset}\n")
        elif kind == "elided":
            body.append(f"{dim}{label}{reset}")
        else:
            ids = ids[:budget]
            budget -= len(ids)
            text = "".join(decode(ids))
            body.append(f"{green}{text}{reset}" if kind == "sampled" else f"{dim}{text}{reset}")
    lines.append("".join(body))
    if not color:
        lines.append("\n(legend: text after a ▌call marker up to the next context is sampled = trainable)")
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:80rem;color:#222}
table{border-collapse:collapse;margin-bottom:1rem}td{padding:.15rem .8rem;border-bottom:1px solid #eee;vertical-align:top}
td:first-child{font-weight:600;white-space:nowrap}
.stream{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;line-height:1.5;border:1px solid #ddd;padding:1rem}
.ctx{color:#888}.smp{background:#d8f5d0;color:#114411}.smp:hover{outline:1px solid #393}
.marker{display:block;margin:.6rem 0 .2rem;color:#a60;font-weight:600}.elided{color:#aaa;font-style:italic}
.legend span{padding:0 .4rem;margin-right:1rem}
"""


def render_html(trace: Trace, *, decode: Decoder = ids_decoder, max_context: int = 2000, max_tokens: int = 200_000) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in _header(trace))
    parts: list[str] = []
    budget = max_tokens
    for kind, label, ids, lps in _segments(trace, max_context):
        if budget <= 0:
            parts.append('<span class="elided">… truncated</span>')
            break
        if kind == "marker":
            parts.append(f'<span class="marker">▌{html.escape(label)}</span>')
        elif kind == "elided":
            parts.append(f'<span class="elided">{html.escape(label)}</span>')
        elif kind == "context":
            ids = ids[:budget]
            budget -= len(ids)
            parts.append(f'<span class="ctx">{html.escape("".join(decode(ids)))}</span>')
        else:
            ids = ids[:budget]
            budget -= len(ids)
            texts = decode(ids)
            parts.append("".join(
                f'<span class="smp" title="id {i} · logprob {lp:.4f}">{html.escape(t)}</span>'
                for i, t, lp in zip(ids, texts, lps, strict=False)
            ))
    mask = trace.loss_mask
    frac = float(mask.mean()) if mask.size else 0.0
    title = html.escape(f"trace {trace.meta.trace_id}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style></head><body>"
        f"<h1>{title}</h1><table>{rows}</table>"
        f"<p class='legend'><span class='ctx'>context (masked)</span><span class='smp'>sampled (trainable)</span>"
        f"{np.round(frac * 100, 1)}% of tokens trainable</p>"
        f"<div class='stream'>{''.join(parts)}</div></body></html>\n"
    )
