"""Session planning, status and webhook delivery: pure logic plus a real HTTP receiver on loopback."""

from __future__ import annotations

import http.server
import json
import threading
import time
from datetime import datetime, timezone

from tracefleet.contract.job import Counters, RolloutJobStatus
from tracefleet.contract.sealed_batch import SealedBatch
from tracefleet.operator import names as n
from tracefleet.operator import status as st
from tracefleet.operator.session_table import decide, observe
from tracefleet.operator.status import Progress, calculate_status, cond, status_changed, status_patch
from tracefleet.operator.webhook import SIGNATURE_HEADER, Delivery, WebhookNotifier, verify_signature


def pod(session: int, attempt: int, phase: str, finished: str = "2026-01-01T00:00:00Z", deleting: bool = False) -> dict:
    meta = {"name": f"j-s{session}-a{attempt}", "labels": {n.LABEL_SESSION: str(session), n.LABEL_ATTEMPT: str(attempt)},
            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:05Z"
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": {"finishedAt": finished}}}] if phase in ("Failed", "Succeeded") else []}}


def ejob(session: int, cond: str | None) -> dict:
    return {"metadata": {"labels": {n.LABEL_SESSION: str(session)}},
            "status": {"conditions": [{"type": cond, "status": "True"}] if cond else []}}


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()


def test_plan_respects_parallelism_and_retries() -> None:
    pods = [pod(0, 0, "Succeeded"), pod(1, 0, "Running"), pod(2, 0, "Failed"), pod(2, 1, "Failed"), pod(2, 2, "Failed"),
            pod(3, 0, "Failed"), pod(4, 0, "Running", deleting=True)]
    t = observe(8, pods, [ejob(0, "Complete")])
    p = decide(t, has_evaluator=True, parallelism=3, max_retries=2, now=T0 + 1000, backoff_base_s=10, backoff_cap_s=60, may_start=True)
    assert p.succeeded == [0]
    assert p.failed == [2]  # 3 failures > maxRetries 2
    # slots: 3 - 1 running - 1 terminating = 1 -> the retry of session 3 (attempt 1) goes first
    assert p.need_pod == [(3, 1)]
    assert p.running == 1


def test_plan_backoff_and_evaluator_states() -> None:
    t = observe(4, [pod(0, 0, "Failed", finished="2026-01-01T00:00:00Z"), pod(1, 0, "Succeeded"), pod(2, 0, "Succeeded"),
                    pod(3, 0, "Succeeded")], [ejob(1, "Failed"), ejob(2, None)])
    p = decide(t, has_evaluator=True, parallelism=10, max_retries=3, now=T0 + 5, backoff_base_s=10, backoff_cap_s=60, may_start=True)
    assert p.need_pod == [] and p.waiting_retry == 1  # still inside the 10 s backoff
    assert p.failed == [1]  # evaluator failed: fail closed
    assert p.need_eval == [3] and p.running == 2
    p2 = decide(t, has_evaluator=True, parallelism=10, max_retries=3, now=T0 + 11, backoff_base_s=10, backoff_cap_s=60, may_start=True)
    assert p2.need_pod == [(0, 1)]
    p3 = decide(t, has_evaluator=True, parallelism=10, max_retries=3, now=T0 + 11, backoff_base_s=10, backoff_cap_s=60, may_start=False)
    assert p3.need_pod == []


def test_status_conditions_keep_transition_time_and_skip_noop_writes() -> None:
    ready = cond(st.COND_INFERENCE_READY, True, st.REASON_DEPLOYMENT_AVAILABLE, "1/1 replicas available")
    running = Progress(2, Counters(total=4, running=1, pending=3), ready)
    t1 = datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=timezone.utc)
    s1 = status_patch(calculate_status(running, RolloutJobStatus(), t1, 5))
    assert s1["phase"] == "Running" and s1["startTime"] == "2026-01-01T00:00:00Z"  # whole seconds, UTC
    assert s1["counters"]["total"] == 4 and s1["observedGeneration"] == 2 and "completionTime" not in s1
    assert {c["type"]: c["observedGeneration"] for c in s1["conditions"]}["Running"] == 2
    old = RolloutJobStatus.model_validate(s1)  # as read back from the API server
    s2 = calculate_status(running, old, datetime(2026, 1, 1, 0, 5, tzinfo=timezone.utc), 5)
    assert not status_changed(old, s2)  # same facts, no write
    batches = [SealedBatch(seq=i, uri=f"s3://b/j/batches/{i:06d}/", traces=2, sealed_at="2026-01-01T00:08:00Z") for i in range(12)]
    done = Progress(2, Counters(total=4, succeeded=4), ready, batches=batches)
    s3 = status_patch(calculate_status(done, old, datetime(2026, 1, 1, 0, 9, tzinfo=timezone.utc), 5))
    complete = next(c for c in s3["conditions"] if c["type"] == "Complete")
    ready_c = next(c for c in s3["conditions"] if c["type"] == "InferenceReady")
    assert complete["lastTransitionTime"] == "2026-01-01T00:09:00Z" and complete["status"] == "True"
    assert ready_c["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert [b["seq"] for b in s3["recentBatches"]] == [7, 8, 9, 10, 11]  # bounded
    assert s3["recentBatches"][0] == {"seq": 7, "uri": "s3://b/j/batches/000007/", "traces": 2, "sealedAt": "2026-01-01T00:08:00Z"}
    assert s3["batchesCompleted"] == 12 and s3["completionTime"] == "2026-01-01T00:09:00Z"
    assert s3["startTime"] == "2026-01-01T00:00:00Z"


class _Receiver(http.server.BaseHTTPRequestHandler):
    fail_first = 2
    got: list[tuple[dict, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((dict(self.headers), body))
        status = 503 if len(type(self).got) <= type(self).fail_first else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


def test_webhook_is_signed_retried_and_deduplicated() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    marked = threading.Event()
    notifier = WebhookNotifier(base_delay_s=0.05, workers=1).start()
    try:
        d = Delivery("uid/0", url, {"batch": {"seq": 0}}, secret=b"k3y", on_delivered=marked.set)
        assert notifier.submit(d)
        assert not notifier.submit(Delivery("uid/0", url, {"batch": {"seq": 0}}))  # already in flight
        assert marked.wait(10)
        assert len(_Receiver.got) == 3  # two 503s, then delivered
        headers, body = _Receiver.got[-1]
        assert verify_signature(b"k3y", body, headers[SIGNATURE_HEADER])
        assert not verify_signature(b"wrong", body, headers[SIGNATURE_HEADER])
        assert json.loads(body) == {"batch": {"seq": 0}}
        assert headers["X-Tracefleet-Delivery"] == "uid/0"
        deadline = time.monotonic() + 5
        while notifier.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert notifier.pending() == 0 and notifier.delivered == 1
    finally:
        notifier.stop()
        srv.shutdown()
