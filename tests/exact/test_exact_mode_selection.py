"""Capture-mode selection: `auto` runs exact where the model's family is supported and its tokenizer is
readable, server otherwise; `exact` asked for explicitly fails closed. The decision is on /health, in
the metrics and in every capture record, through the app and the real `tracefleet proxy` command."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tracefleet.contract.capture import read_capture_log
from tracefleet.proxy.app import create_app
from tracefleet.proxy.config import PresetSession, ProxyConfig
from tracefleet.proxy.mode import ExactModeUnavailable

from fixtures.hub_cache import write_hub_model
from fixtures.servers import quiet_child_env, serving, stop_process_group

SECRET = "mode-secret-0123456789"
# a template of no family exact mode parses (Mistral-style [INST] turns)
FOREIGN_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
                    "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")


def _config(engine_url: str, tmp_path: Path, **kw) -> ProxyConfig:
    return ProxyConfig(engine_url=engine_url, capture_dir=tmp_path / "capture", admin_token="admin",
                       sessions=[PresetSession(session_id="s1", secret=SECRET)], **kw)


def _one_call(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {SECRET}"}, timeout=60,
                      json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})


@pytest.mark.parametrize("model_path,family", [("smollm2", "chatml"), ("gemma3-270m", "gemma3")])
def test_auto_runs_exact_for_supported_families(model_path, family, scripted_engine, tmp_path: Path):
    app = create_app(_config(scripted_engine.url, tmp_path, mode="auto", model_path=model_path))
    decision = app.state.proxy.mode_decision
    assert (decision.mode, decision.requested, decision.family) == ("exact", "auto", family)
    assert app.state.proxy.engine.mode == "exact"


def test_auto_falls_back_to_server_and_says_why(scripted_engine, tmp_path: Path):
    foreign = write_hub_model(tmp_path / "hf", "acme/foreign-chat", chat_template=FOREIGN_TEMPLATE)
    cases = {
        str(foreign): "is of no family exact mode parses",
        str(tmp_path / "no-such-model"): "cannot load the tokenizer",
    }
    for ref, why in cases.items():
        app = create_app(_config(scripted_engine.url, tmp_path, mode="auto", model_path=ref))
        decision = app.state.proxy.mode_decision
        assert decision.mode == "server" and why in decision.reason and ref in decision.reason, decision
        with pytest.raises(ExactModeUnavailable, match=why):  # the same model asked for in exact mode: refused
            create_app(_config(scripted_engine.url, tmp_path, mode="exact", model_path=ref))
    # the family named explicitly: exact mode takes the operator's word for it
    app = create_app(_config(scripted_engine.url, tmp_path, mode="exact", model_path=str(foreign), model_family="chatml"))
    assert app.state.proxy.mode_decision.mode == "exact"

    # what a user sees: /health, the metric, and every capture record
    app = create_app(_config(scripted_engine.url, tmp_path, mode="auto", model_path=str(foreign)))
    with serving(app) as served:
        health = httpx.get(served.url + "/health").json()
        assert health["capture_mode"]["mode"] == "server" and health["capture_mode"]["requested"] == "auto"
        assert _one_call(served.url).status_code == 200
        metrics = httpx.get(served.url + "/metrics").text
    assert 'tracefleet_proxy_capture_mode{family="",mode="server",requested="auto"} 1.0' in metrics
    (rec,) = read_capture_log(tmp_path / "capture" / "s1.jsonl").records
    assert rec.mode == "server" and rec.splice is None and rec.prompt_ids


def _start_cli(args: list[str], tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "tracefleet", "proxy", "--port", "0", "--port-file", str(port_file),
                             "--capture-dir", str(tmp_path / "capture"), "--session", f"s1:{SECRET}", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, port_file


def _cli_url(proc: subprocess.Popen, port_file: Path) -> str:
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    return f"http://127.0.0.1:{port_file.read_text()}"


def test_cli_resolves_a_hub_model_in_the_local_cache_and_refuses_impossible_exact(scripted_engine, tmp_path: Path):
    """A proxy sidecar with a vLLM model cache mounted: `--model-path ORG/NAME` resolves offline in $HF_HOME/hub."""
    hf_home = tmp_path / "hf"
    write_hub_model(hf_home, "acme/tiny-chat")
    env = quiet_child_env(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    proc, port_file = _start_cli(["--engine", scripted_engine.url, "--model-path", "acme/tiny-chat"], tmp_path, env)
    try:
        url = _cli_url(proc, port_file)
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["capture_mode"]["mode"] == "exact" and health["capture_mode"]["model"] == "acme/tiny-chat"
        assert _one_call(url).status_code == 200
    finally:
        stop_process_group(proc)
    out = proc.stdout.read() if proc.stdout else ""
    assert "capture mode exact (the model's family is supported)" in out
    (rec,) = read_capture_log(tmp_path / "capture" / "s1.jsonl").records
    assert rec.mode == "exact" and rec.splice is not None and rec.splice.new_root_reason == "new_conversation"

    # exact asked for, the model not in the cache: exit 2 with the reason, never a silent server-mode proxy
    done = subprocess.run([sys.executable, "-m", "tracefleet", "proxy", "--engine", scripted_engine.url, "--mode", "exact",
                           "--model-path", "acme/not-there", "--capture-dir", str(tmp_path / "c2"), "--session",
                           f"s1:{SECRET}"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'acme/not-there'" in done.stdout and "local cache" in done.stdout


def test_cli_given_only_the_engine_asks_it_for_the_model_and_runs_exact(cpu_engine, tmp_path: Path):
    """`tracefleet proxy --engine URL` alone, in front of the real CPU engine: the proxy reads the served model
    (and the engine its context) from /v1/models, resolves the shipped model's tokenizer and runs exact."""
    (card,) = httpx.get(cpu_engine.url + "/v1/models", timeout=10).json()["data"]
    assert card["id"] == "smollm2" and card["max_model_len"] == 4096  # `tracefleet engine`'s llama default
    proc, port_file = _start_cli(["--engine", cpu_engine.url], tmp_path, quiet_child_env())
    try:
        url = _cli_url(proc, port_file)
        health = httpx.get(url + "/health", timeout=10).json()["capture_mode"]
        assert (health["mode"], health["requested"], health["model"]) == ("exact", "auto", "smollm2"), health
        assert _one_call(url).status_code == 200
    finally:
        stop_process_group(proc)
    assert "capture mode exact (the model's family is supported)" in (proc.stdout.read() if proc.stdout else "")
    (rec,) = read_capture_log(tmp_path / "capture" / "s1.jsonl").records
    assert rec.mode == "exact" and rec.engine_model == "smollm2" and rec.completion_ids


def test_an_engine_that_cannot_be_asked_leaves_auto_on_server_with_the_reason(tmp_path: Path):
    from tracefleet.runner.services import free_port  # nothing listens there: a sidecar started before its engine

    app = create_app(_config(f"http://127.0.0.1:{free_port()}", tmp_path, mode="auto"))
    decision = app.state.proxy.mode_decision
    assert decision.mode == "server" and "no model to read a tokenizer from" in decision.reason


def test_an_engine_serving_an_alias_gives_its_root_as_the_tokenizer(make_scripted_engine, tmp_path: Path):
    """Served under another name (vLLM --served-model-name): the name reads as no tokenizer here, the engine's
    `root` (the model as it was given, `smollm2`) does; calls still go out under the served name."""
    engine = make_scripted_engine(extra_args=["--served-model-name", "policy-v3"])
    app = create_app(_config(engine.url, tmp_path, mode="auto"))
    decision = app.state.proxy.mode_decision
    assert (decision.mode, decision.model, decision.family) == ("exact", "smollm2", "chatml"), decision
    with serving(app) as served:
        assert _one_call(served.url).status_code == 200
    (rec,) = read_capture_log(tmp_path / "capture" / "s1.jsonl").records
    assert rec.mode == "exact" and rec.engine_model == "policy-v3"
