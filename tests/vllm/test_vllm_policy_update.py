"""Against real vLLM (the session's `vllm_server`, VLLM_SERVER_DEV_MODE=1): two policy updates driven by the
trainer control (`tracefleet.trainer.update_policy`), which calls the engine only, never the proxy.

Update 1 pauses with mode=keep while a streamed call is generating: the call is neither lost nor cut (the
harness gets a normal finish), and its record and trace carry two spans, the tokens before the pause under
version 0 and those after under version 1, split at the engine's version mark with a clear margin. Calls
after each update carry the new version (the proxy learnt it from the engine) and, the weights having
changed, other logprobs for the same prompt. Update 2 pauses with mode=abort, as an engine without keep mode
would be: its call in flight is recorded aborted with the tokens it had (what a sync wastes), never as a
finished turn. The server is shared: its weights and label are put back at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tracefleet.cli import main as cli_main
from tracefleet.contract.policy import label_version
from tracefleet.trainer import EngineControl, update_policy
from tracefleet.traces import SessionInfo, build_traces
from tracefleet.traces.calls import call_from_record

from fixtures.checkpoints import changed_checkpoint, restore_served_weights
from fixtures.proxy_on_vllm import (ProxyOnVllm, auth_headers, dialect_request, post,  # noqa: F401 (proxies)
                                    RUNS_TO_CAP_TOKENS, proxies, served_model_dir)

SHORT = "Say hello."
# greedy, it runs to the output cap (512 tokens) at each of the test's weights (measured: versions 0, 1 and 2)
LONG = "Write a very long story about a dragon who learns to cook."


def short_call(proxy: ProxyOnVllm, model: str) -> Any:
    path, body = dialect_request("chat", model, SHORT, 8)
    r = post(proxy, "chat", path, body)
    assert r.status_code == 200, r.text
    return proxy.records()[-1]


# The streamed call must still be generating when the update's pause lands: the steps before it (the weights'
# check, /version, for abort a /metrics scrape) took up to 2.2 s under the full suite's load on 2 cores (CI), and
# a 96-token call was outrun once. Keep lets the call finish after the resume, so its length is test time (256
# tokens: ~17 s here); abort cuts it, so it asks for the engine's whole output cap.
KEEP_TOKENS = 256
ABORT_TOKENS = RUNS_TO_CAP_TOKENS


def update_while_streaming(proxy: ProxyOnVllm, model: str, update: Any,
                           max_tokens: int) -> tuple[list[dict[str, Any]], Any]:
    """A streamed call of up to `max_tokens` generating when `update()` runs; (the SSE data the harness got,
    update's result)."""
    lines: list[str] = []

    def call() -> None:
        path, body = dialect_request("chat", model, LONG, max_tokens, stream=True)
        with httpx.stream("POST", proxy.url + path, json=body, headers=auth_headers("chat"), timeout=300) as r:
            lines.extend(r.iter_lines())

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 120
    while sum('"content":"' in line and '"content":""' not in line for line in lines) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    result = update()
    thread.join(300)
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"], result


def test_two_policy_updates_keep_and_label_every_token(vllm_server: Any, proxies: Any, tmp_path: Path,
                                                       capsys: Any) -> None:
    proxy, model = proxies["exact"], vllm_server.model
    model_dir = Path(served_model_dir(vllm_server.url))
    v1 = changed_checkpoint(model_dir, tmp_path / "policy-1", scale=0.5)
    v2 = changed_checkpoint(model_dir, tmp_path / "policy-2", scale=0.25)
    engine = EngineControl(vllm_server.url)
    try:
        before = short_call(proxy, model)
        assert before.policy_version == 0 and before.weight_versions is None  # no update yet: nothing to split

        # update 1, mode=keep, a call in flight
        data, report1 = update_while_streaming(proxy, model, lambda: update_policy([vllm_server.url], v1, 1),
                                                KEEP_TOKENS)
        assert report1.modes == {vllm_server.url: "keep"} and report1.in_flight[0].kept >= 1
        assert not any("error" in c for c in data) and data[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        kept = next(r for r in reversed(proxy.records()) if r.stream)
        assert kept.status == "ok" and kept.error is None
        spans = kept.weight_versions
        assert [label_version(s["version"]) for s in spans] == [None, 1], spans  # "default": the weights it began with
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] > 0 and spans[1]["end"] == len(kept.completion_ids)
        # the split is unambiguous: tokens on each side arrived well away from the mark (the load, the guard)
        assert spans[1]["margin_s"] > 0.02, spans
        assert engine.label() == report1.label and label_version(report1.label) == 1
        capsys.readouterr()
        assert cli_main(["policy", "show", "--engine", vllm_server.url]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["policy_version"], shown["paused"], shown["label"]) == (1, False, report1.label)

        after1 = short_call(proxy, model)
        assert [label_version(s["version"]) for s in after1.weight_versions] == [1]
        assert call_from_record(after1, 0).policy_version == 1
        assert after1.prompt_ids == before.prompt_ids and after1.logprobs != before.logprobs  # other weights sampled

        # update 2, mode=abort (an engine without keep): the call in flight is cut, recorded with its tokens
        data, report2 = update_while_streaming(proxy, model,
                                               lambda: update_policy([vllm_server.url], v2, 2, mode="abort"),
                                               ABORT_TOKENS)
        assert data[-1].get("error", {}).get("code") == "engine_aborted", data[-1]
        aborted = next(r for r in reversed(proxy.records()) if r.stream)
        assert (aborted.status, aborted.error.kind if aborted.error else None) == ("partial", "engine_aborted")
        assert report2.in_flight[0].aborted >= 1
        after2 = short_call(proxy, model)
        # the record's policy_version is what the proxy knew at admission (its last read came before the update);
        # the spans, read when the call was recorded, are the truth, and what traces and diagnostics use
        assert [label_version(s["version"]) for s in after2.weight_versions] == [2]
        assert call_from_record(after2, 0).policy_version == 2
        assert after2.logprobs != after1.logprobs
    finally:  # the server is shared by the session's tests: its own weights and label back
        restore_served_weights(engine, model_dir)

    # the trainer's view: the straddling call's trace has a span per version, the reader a version per token
    result = build_traces(proxy.capture / "s.jsonl", builder="per-request",
                          session=SessionInfo(job="j", task_id="t", group_id="t", sample_index=0, reward=1.0))
    trace = next(t for t in result.traces if kept.call_id in t.call_ids)
    assert [(s.policy_version, s.completion_end - s.completion_start) for s in trace.spans] == \
        [(0, spans[0]["end"]), (1, spans[1]["end"] - spans[1]["start"])]
    versions = trace.token_versions()[trace.loss_mask == 1].tolist()
    assert versions == [0] * spans[0]["end"] + [1] * (spans[1]["end"] - spans[1]["start"])
    assert aborted.call_id not in {c for t in result.traces for c in t.call_ids}  # a cut turn is never trained on

    steps1, steps2 = report1.step_seconds(), report2.step_seconds()
    print(f"update 1 (keep): {report1.seconds:.2f} s, paused {report1.paused_seconds:.2f} s, steps "
          f"{ {k: round(v, 3) for k, v in steps1.items()} }; in flight {report1.in_flight[0].model_dump()}; "
          f"kept call: {spans[0]['end']} tokens before the pause, {len(kept.completion_ids) - spans[0]['end']} after, "
          f"margin {spans[1]['margin_s']} s")
    print(f"update 2 (abort): {report2.seconds:.2f} s, paused {report2.paused_seconds:.2f} s, steps "
          f"{ {k: round(v, 3) for k, v in steps2.items()} }; tokens aborted: {len(aborted.completion_ids)}")


# The reference trainer's logprobs of the engine's own tokens, SmolLM2 float32 on torch vs vLLM's CPU kernels:
# measured max |delta| 3.2e-5 (version 0) and 2.2e-5 (after one step) over a 24-token T=1 call; the bound leaves
# room for other thread counts and longer prompts.
LOGPROB_TOLERANCE = 1e-3


def sampled_call(proxy: ProxyOnVllm, model: str) -> tuple[Any, dict[str, Any]]:
    """One sampled chat call through the exact-mode proxy: (its capture record, its trace as the reader's
    tensors with advantage 1)."""
    from tracefleet.traces.batch import traces_to_table
    from tracefleet.traces.reader import padded_tensors

    path, body = dialect_request("chat", model, SHORT, 24, temperature=1.0, seed=11)
    assert post(proxy, "chat", path, body).status_code == 200
    rec = proxy.records()[-1]
    result = build_traces(proxy.capture / "s.jsonl", builder="per-request",
                          session=SessionInfo(job="j", task_id="t", group_id="t", sample_index=0, reward=1.0))
    trace = next(t for t in result.traces if t.call_ids == [rec.call_id])
    return rec, padded_tensors(traces_to_table([trace]), advantages=[1.0])


def test_reference_trainer_recomputes_the_engines_logprobs_and_syncs_its_weights(vllm_server: Any, proxies: Any,
                                                                                  tmp_path: Path) -> None:
    import torch

    from tracefleet.trainer.grpo import grpo_step, load_policy, save_weights, token_logprobs, trainable

    proxy, model = proxies["exact"], vllm_server.model
    model_dir = Path(served_model_dir(vllm_server.url))

    def sampled() -> tuple[Any, dict[str, Any]]:
        return sampled_call(proxy, model)

    engine = EngineControl(vllm_server.url)
    try:
        rec0, t0 = sampled()
        policy = load_policy(model_dir)
        with torch.no_grad():
            lp0 = token_logprobs(policy, t0["input_ids"], t0["attention_mask"], t0["temperatures"])
        on = t0["loss_mask"] > 0
        delta0 = float((lp0 - t0["old_logprobs"])[on].abs().max())
        assert on.sum().item() == len(rec0.completion_ids) and delta0 < LOGPROB_TOLERANCE, delta0

        stats = grpo_step(policy, torch.optim.AdamW(trainable(policy), lr=1e-4), t0)
        assert abs(stats["max_abs_dlogprob"] - delta0) < 1e-6 and stats["tokens"] == len(rec0.completion_ids)
        report = update_policy([vllm_server.url], save_weights(policy, tmp_path / "step-1"), 1)  # every trained tensor
        rec1, t1 = sampled()
        assert [label_version(s["version"]) for s in rec1.weight_versions] == [1]
        assert rec1.logprobs[0] != rec0.logprobs[0]  # the trained weights sample now
        with torch.no_grad():
            lp1 = token_logprobs(policy, t1["input_ids"], t1["attention_mask"], t1["temperatures"])
        delta1 = float((lp1 - t1["old_logprobs"])[t1["loss_mask"] > 0].abs().max())
        assert delta1 < LOGPROB_TOLERANCE, delta1  # the engine runs exactly the trainer's weights
    finally:
        restore_served_weights(engine, model_dir)
    print(f"trainer vs engine max |d logprob|: version 0 {delta0:.2e}, version 1 {delta1:.2e} "
          f"({len(rec0.completion_ids)}, {len(rec1.completion_ids)} tokens); step stats {stats}; full-checkpoint sync "
          f"{report.seconds:.2f} s, steps { {k: round(v, 3) for k, v in report.step_seconds().items()} }")


def test_the_loops_trainer_top_layers_and_epochs_sync_exactly_what_it_holds(vllm_server: Any, proxies: Any,
                                                                             tmp_path: Path) -> None:
    """`tracefleet train`'s configuration: the top layers trained from the frozen layers' hidden states
    computed once, several epochs, a checkpoint of the trained tensors only; the engine then samples with
    exactly the weights the trainer holds."""
    import torch

    from tracefleet.trainer.grpo import frozen_prefix, grpo_step, load_policy, sampled_logprobs, save_weights, trainable

    proxy, model = proxies["exact"], vllm_server.model
    model_dir = Path(served_model_dir(vllm_server.url))
    engine = EngineControl(vllm_server.url)
    try:
        rec0, t0 = sampled_call(proxy, model)
        policy = load_policy(model_dir, train_layers=4)
        stats = grpo_step(policy, torch.optim.AdamW(trainable(policy), lr=1e-4), t0, epochs=3)
        assert stats["epochs"] == 3 and stats["max_abs_dlogprob"] < LOGPROB_TOLERANCE, stats  # prefix path = engine at v0
        update_policy([vllm_server.url], save_weights(policy, tmp_path / "step-1"), 1)  # four layers and the norm
        rec1, t1 = sampled_call(proxy, model)
        assert [label_version(s["version"]) for s in rec1.weight_versions] == [1] and rec1.logprobs != rec0.logprobs
        with torch.no_grad():
            prefix = frozen_prefix(policy, t1["input_ids"], t1["attention_mask"])
            lp1 = sampled_logprobs(policy, t1["input_ids"], t1["attention_mask"], t1["loss_mask"], t1["temperatures"], prefix)
        delta1 = float((lp1 - t1["old_logprobs"])[t1["loss_mask"] > 0].abs().max())
        assert delta1 < LOGPROB_TOLERANCE, delta1
    finally:
        restore_served_weights(engine, model_dir)
    print(f"top-4-layer trainer, 3 epochs: max |d logprob| vs the engine {stats['max_abs_dlogprob']:.2e} at version 0, "
          f"{delta1:.2e} after the sync; clipped share in the last epoch {stats['clipped_share']:.2f}")


def test_the_loops_generation_hold_pauses_the_engine_once_the_bound_is_reached(vllm_server: Any) -> None:
    """`tracefleet train`'s producer-side bound: while batch 0 trains, the engine samples on until `max_lag`
    sealed batches wait behind it, then is paused (keep) at once, not at the next step; a step that trains
    nothing resumes it. With max_lag 0 every step pauses it (on-policy), and so does the `alternate` schedule."""
    from types import SimpleNamespace

    from tracefleet.trainer.loop import GenerationHold

    sealed = [0]
    reader = SimpleNamespace(seqs=lambda: list(sealed))
    engine = EngineControl(vllm_server.url)
    try:
        hold = GenerationHold(vllm_server.url, reader, max_lag=1, poll_s=0.05)
        with hold.watching(0):
            time.sleep(0.2)
            assert not hold.held and not engine.is_paused()  # nothing waits yet: generation goes on
            sealed.append(1)  # batch 1 sealed mid-step: whatever is sampled next would be 2 versions old
            deadline = time.monotonic() + 5
            while not hold.held and time.monotonic() < deadline:  # set once the engine answered the pause
                time.sleep(0.02)
            assert hold.held and engine.is_paused() and hold.holds == 1
        hold.release()
        assert not hold.held and not engine.is_paused()
        on_policy = GenerationHold(vllm_server.url, SimpleNamespace(seqs=lambda: [0]), max_lag=0)
        on_policy.check(0)
        assert on_policy.held and engine.is_paused()
        on_policy.release()
        assert not engine.is_paused()
        # the `alternate` schedule: every step pauses it, nothing waiting and the bound at 1; not counted as a hold
        alternate = GenerationHold(vllm_server.url, SimpleNamespace(seqs=lambda: [0]), max_lag=1, every_step=True)
        with alternate.watching(0):
            assert alternate.held and engine.is_paused() and alternate.holds == 0
        alternate.release()
        assert not engine.is_paused()
    finally:
        if engine.is_paused():
            engine.resume()
        engine.close()


def test_a_failed_load_leaves_the_engine_paused_until_a_good_one(vllm_server: Any, tmp_path: Path) -> None:
    """vLLM 0.32 (CPU) after a failed in-place reload has its parameters on the meta device: the next generation
    step kills the engine (measured). So the control refuses a directory with no weights before touching the
    engine, and after a load that failed it leaves the engine paused; a good load then brings it back whole."""
    from tracefleet.trainer import PolicyUpdateFailed

    def scored() -> list[float]:
        body = {"model": vllm_server.model, "prompt": [1, 504, 3458, 282], "max_tokens": 4, "temperature": 0,
                "logprobs": 0}
        r = httpx.post(vllm_server.url + "/v1/completions", json=body, timeout=120).raise_for_status().json()
        return r["choices"][0]["logprobs"]["token_logprobs"]

    before = scored()
    engine = EngineControl(vllm_server.url)
    try:
        for unusable in (tmp_path / "missing", tmp_path):  # no directory; a directory without weights
            try:
                update_policy([vllm_server.url], unusable, 5)
                raise AssertionError(f"{unusable} was loaded")
            except ValueError as exc:
                assert str(unusable) in str(exc)
        assert not engine.is_paused()

        corrupt = tmp_path / "corrupt"
        corrupt.mkdir()
        (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
        try:
            update_policy([vllm_server.url], corrupt, 5)
            raise AssertionError("a corrupt checkpoint was loaded")
        except PolicyUpdateFailed as exc:
            report, message = exc.report, str(exc)
        assert [(s.step, s.ok) for s in report.steps] == [("pause", True), ("load", False)], report.steps
        assert report.left_paused and "left paused" in message and message.startswith(f"load on {vllm_server.url}")
        assert engine.is_paused() and label_version(engine.label()) is None  # paused, the old label kept
    finally:
        engine.reload(str(Path(served_model_dir(vllm_server.url))))
        engine.resume()
        engine.close()
    assert scored() == before  # whole again, with the weights it had
