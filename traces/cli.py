"""`tracefleet traces`: list, show, export and flush trace batches.

URI is a bucket (`s3://bucket/prefix`, a directory) holding `<job>/batches/<seq>/`, or a single capture
log (`*.jsonl`) whose traces are built on the fly. S3 endpoint and credentials come from the usual env
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or the flags below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tracefleet.contract.layout import batches_prefix
from tracefleet.contract.semantics import OUTCOME_KIND_WORDS, OutcomeKind, outcome_counts
from tracefleet.usage import USAGE_EXIT, UsageError

EXAMPLES = """examples:
  tracefleet traces ls ./batches                         # jobs in a directory bucket
  tracefleet traces ls capture/sess-1.jsonl              # the traces a capture log builds into
  tracefleet traces ls s3://rl/runs --job swe-1          # that job's sealed batches
  tracefleet traces ls s3://rl/runs --job swe-1 --batch 3   # its rows: session, reward, whose outcome
  tracefleet traces show s3://rl/runs --job swe-1 --batch 3 --trace 0
  tracefleet traces show capture/sess-1.jsonl --html sess-1.html   # build + render a capture log
  tracefleet traces export ./batches --job swe-1 --batch 0 --format jsonl --out batch0.jsonl
  tracefleet traces flush s3://rl/runs --job swe-1       # upload batches left in the local spool
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    sub = parser.add_subparsers(dest="traces_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser, job: bool = True) -> None:
        p.add_argument("uri", help="bucket (s3://bucket/prefix or a directory) or a capture log (.jsonl)")
        if job:
            p.add_argument("--job", help="job name (the folder under the bucket prefix); optional when there is one job")
        add_bucket_options(p)

    ls = sub.add_parser("ls", help="list jobs, a job's batches (seq, traces, tokens, reward), or a capture log's traces")
    common(ls)
    ls.add_argument("--batch", type=int, help="list that batch's rows (session, reward, outcome) instead of the batches")
    ls.add_argument("--json", action="store_true", help="print manifests (a capture log or --batch: trace metadata) as JSON")
    ls.add_argument("--builder", default="prefix-merge", choices=["prefix-merge", "per-request"], help="for capture logs")

    show = sub.add_parser("show", help="render a trace: masked vs trainable tokens, reward, stats")
    common(show)
    show.add_argument("--batch", type=int, help="batch seq (default: the latest)")
    show.add_argument("--trace", default="0", help="row number in the batch or a trace id (default 0)")
    show.add_argument("--builder", default="prefix-merge", choices=["prefix-merge", "per-request"], help="for capture logs")
    show.add_argument("--tokenizer", metavar="REF",
                      help="tokenizer to decode with: a shipped model (smollm2, gemma3-270m), a .gguf file, a Hugging "
                      "Face model directory or hub id in the local cache, or a tokenizer.json (default: the trace's "
                      "own model, when this machine has it)")
    show.add_argument("--ids", action="store_true", help="show token ids, not text")
    show.add_argument("--html", metavar="FILE", help="also write a standalone HTML page")
    show.add_argument("--max-context", type=int, default=64, help="context tokens shown per turn (middle elided)")
    show.add_argument("--max-tokens", type=int, default=4000, help="tokens shown in the terminal")
    show.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    export = sub.add_parser("export", help="write a batch (or a capture log's traces) as JSONL or Parquet")
    common(export)
    export.add_argument("--batch", type=int, help="batch seq (default: all batches)")
    export.add_argument("--builder", default="prefix-merge", choices=["prefix-merge", "per-request"])
    export.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    export.add_argument("--out", required=True, help="output file")

    flush = sub.add_parser("flush", help="upload batches kept in the local spool after a failed seal")
    common(flush)
    flush.add_argument("--spool", help="spool directory (default: $TRACEFLEET_SPOOL or ~/.cache/tracefleet/spool)")


def add_bucket_options(p: argparse.ArgumentParser) -> None:
    """How a command reaches an S3 bucket (`bucket_from_args` opens it)."""
    p.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")
    p.add_argument("--profile", help="AWS profile for credentials")
    p.add_argument("--region", help="S3 region")


def bucket_from_args(args: argparse.Namespace) -> Any:
    """`args.uri` opened with `add_bucket_options`' options; a directory is never created."""
    from tracefleet.bucket import open_bucket

    opts = {k: v for k, v in {"endpoint_url": args.endpoint_url, "profile": args.profile, "region": args.region}.items() if v}
    if not str(args.uri).startswith("s3://"):
        opts = {"create": False}
    return open_bucket(args.uri, **opts)


def _jobs(bucket: Any) -> list[str]:
    return [d for d in bucket.list_dirs("") if bucket.list_dirs(batches_prefix(d))]


def _job(args: argparse.Namespace, bucket: Any) -> str:
    if args.job:
        return str(args.job)
    jobs = _jobs(bucket)
    if len(jobs) != 1:
        raise SystemExit(f"--job is required: {bucket.uri} holds {len(jobs)} jobs ({', '.join(jobs) or 'none'})")
    return jobs[0]


CAPTURE_LOG_SUFFIX = ".jsonl"
WHAT_URI_IS = "a bucket (a directory or s3://BUCKET/PREFIX) or a capture log (.jsonl)"


def _is_capture_log(uri: str) -> bool:
    """True for a capture log; a path that cannot be one a bucket can be either is a UsageError here, so
    that neither is reported as the other (`traces ls missing.jsonl` is a missing capture log)."""
    if "://" in uri:
        return False
    path = Path(uri)
    if uri.endswith(CAPTURE_LOG_SUFFIX):
        if path.is_file():
            return True
        raise UsageError(f"{uri}: no such capture log" if not path.exists() else f"{uri} is not a file: expected a capture log")
    if path.is_file():
        raise UsageError(f"{uri} is a file, not {WHAT_URI_IS}")
    return False


def _load_traces(args: argparse.Namespace) -> tuple[list[Any], str]:
    from tracefleet.traces.reader import BatchReader

    if _is_capture_log(args.uri):
        return _capture_traces(args), f"{args.uri} ({args.builder})"
    bucket = bucket_from_args(args)
    job = _job(args, bucket)
    reader = BatchReader(bucket, job)
    seqs = reader.seqs()
    if not seqs:
        jobs = _jobs(bucket)
        raise UsageError(f"no sealed batches for job {job!r} in {bucket.uri} (jobs there: {', '.join(jobs) or 'none'})")
    if getattr(args, "batch", None) is None and args.traces_command == "export":
        return [t for s in seqs for t in reader.read(s).traces()], f"{bucket.uri} job {job}"
    seq = args.batch if args.batch is not None else seqs[-1]
    if seq not in seqs:
        raise UsageError(f"--batch {seq}: job {job!r} has no such batch (sealed: {_seq_ranges(seqs)})")
    return reader.read(seq).traces(), f"{bucket.uri} job {job} batch {seq:06d}"


def _seq_ranges(seqs: list[int]) -> str:
    """`0..3, 7` for [0, 1, 2, 3, 7]."""
    runs: list[list[int]] = []
    for s in sorted(seqs):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _capture_traces(args: argparse.Namespace) -> list[Any]:
    """The traces a capture log builds into; the model the engine served rides along as trace metadata
    (a capture log has no runner to name it), so `show` can find the tokenizer."""
    from tracefleet.contract.capture import read_capture_log

    from tracefleet.traces.build import build_traces
    from tracefleet.traces.schema import SessionInfo

    log = read_capture_log(args.uri)
    if not log.records and log.bad_lines:
        raise UsageError(f"{args.uri}: no capture records ({len(log.bad_lines)} line(s) are not capture records)")
    first = log.records[0] if log.records else None
    model = (first.engine_model or first.requested_model) if first is not None else None
    session = SessionInfo(session_id=Path(args.uri).stem, model=model)
    return build_traces(log, builder=args.builder, session=session).traces


def main(args: argparse.Namespace) -> int:
    from tracefleet.bucket import BucketError, BucketNotFound

    try:
        return {"ls": _ls, "show": _show, "export": _export, "flush": _flush}[args.traces_command](args)
    except BucketNotFound as exc:  # a wrong name is the user's to fix: a usage mistake
        print(f"tracefleet traces: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except BucketError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _ls(args: argparse.Namespace) -> int:
    from tracefleet.traces.reader import BatchReader

    if _is_capture_log(args.uri) or args.batch is not None:
        return _ls_traces(args)
    bucket = bucket_from_args(args)
    if not args.job:
        jobs = _jobs(bucket)
        for job in jobs:
            print(f"{job}\t{len(BatchReader(bucket, job).seqs())} batches")
        if not jobs:
            print(f"no jobs with sealed batches in {bucket.uri}", file=sys.stderr)
        return 0
    manifests = BatchReader(bucket, args.job).batches()
    if args.json:
        print(json.dumps([m.model_dump(mode="json") for m in manifests], indent=2))
        return 0
    # sessions by whose outcome they are (tracefleet.contract.semantics): the infrastructure's are not trained on
    kinds = [OUTCOME_KIND_WORDS[k].removeprefix("the ") for k in OutcomeKind]
    print(f"{'seq':>6}  {'traces':>6}  {'sessions':>8}  {'tokens':>10}  {'trainable':>10}  {'reward mean':>11}  "
          f"{'fail-closed':>11}  " + "  ".join(kinds) + "  size")
    for m in manifests:
        mean = f"{m.reward.mean:.3f}" if m.reward.mean is not None else "-"
        size = sum(o.size for o in m.objects)
        counts = outcome_counts(m).to_json() if m.outcome_kinds else {}  # sealed before kinds: not known
        by_kind = "  ".join(f"{counts.get(k.value, '-'):>{len(w)}}" for k, w in zip(OutcomeKind, kinds, strict=True))
        print(f"{m.seq:>6}  {m.traces:>6}  {m.sessions:>8}  {m.tokens:>10,}  {m.trainable_tokens:>10,}  {mean:>11}  "
              f"{m.reward.fail_closed:>11}  {by_kind}  {size:,} B")
    return 0


def _ls_traces(args: argparse.Namespace) -> int:
    """A capture log's traces (prefix-merge) or a batch's rows (`--batch`), one line each: what `traces show
    --trace N` would render, with whose outcome the row is."""
    traces, where = _load_traces(args)
    if args.json:
        print(json.dumps([t.meta.model_dump(mode="json") for t in traces], indent=2))
        return 0
    print(f"{'trace':>5}  {'calls':>5}  {'tokens':>8}  {'trainable':>9}  {'reward':>6}  {'outcome':<20}  session / trace id")
    for i, t in enumerate(traces):
        reward = "-" if t.meta.reward is None else f"{t.meta.reward:g}"
        print(f"{i:>5}  {len(t.spans):>5}  {t.num_tokens:>8,}  {t.num_trainable:>9,}  {reward:>6}  "
              f"{OUTCOME_KIND_WORDS[t.meta.outcome_kind]:<20}  {t.meta.session_id} / {t.meta.trace_id}")
    if not traces:
        print(f"no traces in {where}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    from tracefleet.traces.render import render_html, render_terminal

    traces, where = _load_traces(args)
    if not traces:
        raise SystemExit(f"no traces in {where}")
    pick = str(args.trace)
    if pick.isdigit():
        if int(pick) >= len(traces):
            raise SystemExit(f"--trace {pick}: {where} has {len(traces)} traces (0..{len(traces) - 1})")
        trace = traces[int(pick)]
    else:
        found = [t for t in traces if t.meta.trace_id == pick]
        if not found:
            raise SystemExit(f"--trace {pick}: no such trace id in {where}")
        trace = found[0]
    decode, shown_as = _decoder(args, trace)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(f"# {where}: trace {traces.index(trace) + 1} of {len(traces)}, shown as {shown_as}")
    sys.stdout.write(render_terminal(trace, decode=decode, color=color, max_context=args.max_context, max_tokens=args.max_tokens))
    if args.html:
        Path(args.html).write_text(render_html(trace, decode=decode), encoding="utf-8")
        print(f"wrote {args.html}")
    return 0


def _decoder(args: argparse.Namespace, trace: Any) -> tuple[Any, str]:
    """(decoder, what it shows) -- text by default: with the tokenizer --tokenizer names (a mistake there is
    the user's), else the trace's own tokenizer or model when this machine has it; token ids otherwise
    (and with --ids), with a note why."""
    from tracefleet.traces.render import ids_decoder, tokenizer_decoder, trace_decoder

    if args.ids:
        return ids_decoder, "token ids"
    if args.tokenizer:
        ref = args.tokenizer
        if ref.endswith((".json", ".gguf")) and not Path(ref).expanduser().exists():
            raise UsageError(f"--tokenizer {ref}: no such file")
        try:
            return tokenizer_decoder(ref), f"text ({ref} tokenizer)"
        except Exception as exc:  # noqa: BLE001 - whatever the loader says, it is about the ref the user gave
            raise UsageError(f"--tokenizer {ref}: {exc}") from None
    decode, used, why = trace_decoder([trace.meta.tokenizer, trace.meta.model])
    if why:
        print(f"(showing token ids: {why}; name one with --tokenizer)", file=sys.stderr)
        return decode, "token ids"
    return decode, f"text ({used} tokenizer)"


def _export(args: argparse.Namespace) -> int:
    import numpy as np

    from tracefleet.traces.batch import table_to_parquet, traces_to_table

    traces, where = _load_traces(args)
    out = Path(args.out)
    if args.format == "parquet":
        out.write_bytes(table_to_parquet(traces_to_table(traces)))
    else:
        with open(out, "w", encoding="utf-8") as f:
            for t in traces:
                row = {
                    "meta": t.meta.model_dump(mode="json"),
                    "tokens": t.tokens.tolist(),
                    "loss_mask": t.loss_mask.tolist(),
                    "logprobs": [None if np.isnan(x) else float(x) for x in t.logprobs.tolist()],
                    "spans": [s.model_dump() for s in t.spans],
                }
                f.write(json.dumps(row) + "\n")
    print(f"exported {len(traces)} traces from {where} to {out}")
    return 0


def _flush(args: argparse.Namespace) -> int:
    from tracefleet.traces.seal import Sealer

    bucket = bucket_from_args(args)
    if not args.job:
        raise SystemExit("--job is required for flush")
    sealer = Sealer(bucket, args.job, spool=args.spool)
    pending = sealer.pending()
    if not pending:
        print(f"nothing pending in {sealer.spool}")
        return 0
    for m in sealer.flush():
        print(f"sealed batch {m.seq:06d} ({m.traces} traces, {m.tokens:,} tokens)")
    return 0
