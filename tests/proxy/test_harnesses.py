"""Real harnesses, unmodified, through the proxy (issue 3 must-show; presets of issue 6).

Each of the six pinned CLIs (installed from npm by hack/setup.d/50-harnesses.sh) runs headless through its
preset in a scratch git repository, against a real `tracefleet proxy` process in front of the scripted engine
(real tokenizer, deterministic tool-using replies). The harness runs in a fresh HOME, with telemetry and
update checks off, and - where user namespaces allow - in a network namespace whose only reachable
endpoint is the proxy (bridged into the namespace's loopback). The engine asks for a shell command in
each of two rounds and then answers in text; the test asserts that the harness exited 0, that both
commands really ran in the workspace, that the harness printed the final answer and no protocol error,
and that the capture log holds every call with prompt and sampled token ids. A second run per harness
presents a wrong key and checks that the harness reports the proxy's 401 in a way the protocol-error check
sees (so that check cannot pass vacuously). The last tests check the presets as pure functions.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tracefleet.capture import read_capture_log
from tracefleet.engine.scripted import Script
from tracefleet.runner.netns import UnixToTcpBridge
from tracefleet.runner.presets import REAL_HARNESSES, get_preset
from tracefleet.runner.sandbox import SandboxOptions, netns_available, run_sandboxed

HARNESS_TIMEOUT_S = 240
MODEL = "tracefleet-scripted"  # what the harness asks for; the proxy maps it to the served model
FINAL_TEXT = "All done: note.txt has both lines."
COMMANDS = ["echo tracefleet-round-1 > note.txt", "echo tracefleet-round-2 >> note.txt"]
EXPECTED_NOTE = "tracefleet-round-1\ntracefleet-round-2\n"

# What each harness prints when a model call failed or its stream could not be parsed. Matched against
# stdout + stderr; a hit means the proxy's wire format broke the harness somewhere.
PROTOCOL_ERRORS = {
    "codex": [r'"type":"turn\.failed"', r'"type":"error","message"', r"stream disconnected", r"unexpected status"],
    "claude-code": [r"API Error", r'"is_error":true', r'"api_error_status":\d', r'"subtype":"api_retry"'],
    "qwen-code": [r"\[API Error", r'"is_error":true', r"Error when talking to"],
    "pi": [r'"stopReason":"error"', r'"errorMessage"'],
    "gemini-cli": [r"\[API Error", r"ApiError", r"GaxiosError", r'"status":"error"', r"Error when talking to"],
    "opencode": [r'"type":"error"', r"APIError", r"AI_\w+Error"],
}
COMMON_ERRORS = [r"Unexpected token", r"SyntaxError", r"invalid_request_error", r"authentication_error"]
# Lines that match an error pattern but are not about the wire: Codex reports an unknown model name (it has
# no metadata for a served model it has never heard of) as an `error` item and carries on.
BENIGN_LINES = [r"Model metadata for `[^`]*` not found"]


@dataclass
class ProxyProcess:
    url: str
    port: int
    admin_token: str
    capture_dir: Path
    process: subprocess.Popen

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {self.admin_token}"}, timeout=30)


def start_proxy(engine_url: str, workdir: Path) -> ProxyProcess:
    capture_dir = workdir / "capture"
    port_file = workdir / "proxy.port"
    token = secrets.token_urlsafe(24)
    log = open(workdir / "proxy.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracefleet", "proxy", "--engine", engine_url, "--capture-dir", str(capture_dir),
         "--port", "0", "--port-file", str(port_file), "--log-level", "warning"],
        env={**os.environ, "TRACEFLEET_ADMIN_TOKEN": token},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"proxy did not start: {(workdir / 'proxy.log').read_text()[-2000:]}")
        time.sleep(0.1)
    port = int(port_file.read_text())
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(url + "/", timeout=2)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                pytest.fail("proxy port never answered")
            time.sleep(0.1)
    return ProxyProcess(url=url, port=port, admin_token=token, capture_dir=capture_dir, process=proc)


def stop_proxy(proxy: ProxyProcess) -> None:
    if proxy.process.poll() is None:
        os.killpg(proxy.process.pid, signal.SIGTERM)
        try:
            proxy.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proxy.process.pid, signal.SIGKILL)
            proxy.process.wait()


def scratch_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("# scratch\nA tiny repository for a harness test.\n")
    git = ["git", "-c", "user.name=tracefleet", "-c", "user.email=tests@tracefleet.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True)
    subprocess.run([*git, "add", "-A"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=path, check=True)
    return path


def harness_script(name: str) -> dict:
    """Two shell rounds through the harness's own shell tool, then the final text (engine Script fields)."""
    return Script(
        tool_rounds=len(COMMANDS),
        commands=COMMANDS,
        final_text=FINAL_TEXT,
        tool_preference=[get_preset(name).shell_tool],
    ).model_dump()


def protocol_errors(name: str, output: str) -> list[str]:
    """The output lines that report a failed model call or an unparsable stream."""
    lines = [line for line in output.splitlines() if not any(re.search(b, line) for b in BENIGN_LINES)]
    patterns = PROTOCOL_ERRORS[name] + COMMON_ERRORS
    return [line[:600] for line in lines if any(re.search(p, line) for p in patterns)]


def printed_text(stdout: str) -> str:
    """stdout, plus the concatenated text deltas of harnesses that print an answer as streamed pieces
    (Gemini CLI's stream-json emits one `message` event per delta)."""
    pieces = []
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("type") == "message" and event.get("role") == "assistant" and event.get("delta"):
            pieces.append(str(event.get("content", "")))
    return stdout + "\n" + "".join(pieces)


@dataclass
class HarnessRun:
    name: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    netns: bool
    workdir: Path
    stdout: str
    stderr: str
    session: dict  # what POST /admin/sessions returned
    closed: dict  # what DELETE /admin/sessions/{id} returned (calls, errors, capture_path)
    proxy_log: str

    @property
    def transcript(self) -> str:
        return (f"--- {self.name} (netns={self.netns}) exit={self.exit_code} timed_out={self.timed_out} "
                f"{self.duration_s:.1f}s\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-4000:]}"
                f"\n--- proxy log\n{self.proxy_log[-3000:]}\n--- session\n{self.closed}")


def run_harness(name: str, engine_url: str, tmp_path: Path, *, api_key: str | None = None,
                extra_env: dict[str, str] | None = None, timeout_s: float = HARNESS_TIMEOUT_S) -> HarnessRun:
    """One headless session of harness `name` through its preset, against a fresh proxy process.
    `api_key` replaces the session secret (to present a wrong credential)."""
    proxy = start_proxy(engine_url, tmp_path)
    bridge = None
    try:
        with proxy.admin() as admin:
            created = admin.post("/admin/sessions", json={"metadata": {"harness": name}})
            assert created.status_code == 201, created.text
            session = created.json()
        # Loopback only: in a fresh network namespace the proxy is the one reachable endpoint (bridged in
        # through a Unix socket onto the namespace's own 127.0.0.1:<same port>).
        use_netns = netns_available()
        options = SandboxOptions()
        if use_netns:
            socket_path = tmp_path / "bridge.sock"
            bridge = UnixToTcpBridge(socket_path, "127.0.0.1", proxy.port).start()
            options = SandboxOptions(netns=True, bridge_port=proxy.port, bridge_socket=socket_path)
        base_url = f"http://127.0.0.1:{proxy.port}{session['base_path']}"

        workdir = scratch_repo(tmp_path / "repo")
        home = tmp_path / "home"
        launch = get_preset(name).launch(
            prompt="Write two lines to note.txt using the shell, then tell me you are done.",
            workdir=workdir, home=home, base_url=base_url, api_key=api_key or session["secret"], model=MODEL,
        )
        for rel, content in launch.files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        result = run_sandboxed(
            launch.argv, cwd=workdir, home=home, env={**launch.env, **(extra_env or {})}, timeout_s=timeout_s,
            stdout_path=tmp_path / "stdout.log", stderr_path=tmp_path / "stderr.log", options=options,
        )
        with proxy.admin() as admin:
            closed = admin.delete(f"/admin/sessions/{session['session_id']}")
            assert closed.status_code == 200, closed.text
        return HarnessRun(
            name=name, exit_code=result.exit_code, timed_out=result.timed_out, duration_s=result.duration_s,
            netns=use_netns, workdir=workdir,
            stdout=(tmp_path / "stdout.log").read_text(errors="replace"),
            stderr=(tmp_path / "stderr.log").read_text(errors="replace"),
            session=session, closed=closed.json(),
            proxy_log=(tmp_path / "proxy.log").read_text(errors="replace"),
        )
    finally:
        if bridge is not None:
            bridge.close()
        stop_proxy(proxy)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_through_proxy(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    scripted_engine.configure(**harness_script(name))
    run = run_harness(name, scripted_engine.url, tmp_path)
    transcript = run.transcript

    assert not run.timed_out, transcript
    assert run.exit_code == 0, transcript
    # The harness really ran both commands the model asked for, in its workspace.
    note = run.workdir / "note.txt"
    assert note.exists(), transcript
    assert note.read_text() == EXPECTED_NOTE, transcript
    # It parsed the final streamed answer and printed it, and no call failed on the wire.
    assert FINAL_TEXT in printed_text(run.stdout), transcript
    assert protocol_errors(name, run.stdout + "\n" + run.stderr) == [], transcript

    info = run.closed
    log = read_capture_log(info["capture_path"])
    assert not log.torn_tail and not log.bad_lines
    records = log.records
    assert len(records) == info["calls"], (len(records), info)
    assert info["errors"] == 0, info
    assert len(records) >= len(COMMANDS) + 1, [r.call_id for r in records]
    for record in records:
        assert record.status == "ok", record.error
        assert record.session_id == run.session["session_id"]
        assert record.prompt_ids, record.call_id
        assert record.completion_ids, record.call_id
        assert len(record.logprobs) == len(record.completion_ids)
    assert {r.dialect for r in records} == {get_preset(name).dialect}
    calls_with_tools = [r for r in records if r.tool_calls]
    assert len(calls_with_tools) >= len(COMMANDS), [r.tool_calls for r in records]
    assert any(FINAL_TEXT in (r.output_text or "") for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_reports_wrong_credentials(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    """A wrong key gets the dialect's 401, which each harness reports as an API error (so the check for
    protocol errors above is not vacuous), nothing runs and nothing is captured."""
    scripted_engine.configure(**harness_script(name))
    # Claude Code retries a 401 ten times with backoff (minutes); one attempt is enough here.
    run = run_harness(name, scripted_engine.url, tmp_path, api_key="wrong-" + secrets.token_hex(16),
                      extra_env={"CLAUDE_CODE_MAX_RETRIES": "0"}, timeout_s=120)
    transcript = run.transcript
    assert not run.timed_out, transcript
    assert protocol_errors(name, run.stdout + "\n" + run.stderr), transcript
    assert "401" in run.stdout + run.stderr, transcript
    assert not (run.workdir / "note.txt").exists(), transcript
    assert run.closed["calls"] == 0, run.closed


# ------------------------------------------------------------------ the presets as pure functions


def launch_of(name: str, tmp_path: Path, **extra):
    return get_preset(name).launch(
        prompt="fix the bug -- now", workdir=tmp_path / "ws", home=tmp_path / "home",
        base_url="http://127.0.0.1:4000/s/s-abc/", api_key="secret-key-123", model="served-model", **extra,
    )


@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_preset_points_the_pinned_cli_at_the_proxy(name: str, harness_binaries, tmp_path: Path) -> None:
    launch = launch_of(name, tmp_path)
    assert launch.argv[0] == str(harness_binaries[name])
    assert "fix the bug -- now" in launch.argv  # the prompt is one argument, never split or shell-parsed
    config = "\n".join(launch.env.values()) + "\n" + "\n".join(launch.files.values())
    assert "http://127.0.0.1:4000/s/s-abc" in config and "/s/s-abc//" not in config
    assert "secret-key-123" in launch.env.values()  # the secret travels in the environment only
    assert "secret-key-123" not in "\n".join(launch.files.values())
    assert launch.env["HOME"] == str(tmp_path / "home")
    assert launch.env["NO_PROXY"].startswith("127.0.0.1")
    assert all(not Path(rel).is_absolute() and ".." not in Path(rel).parts for rel in launch.files)


def test_codex_preset_config_is_valid_toml_with_outbound_traffic_off(tmp_path: Path) -> None:
    import tomllib

    launch = launch_of("codex", tmp_path)
    config = tomllib.loads(launch.files[".codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:4000/s/s-abc/v1"
    assert provider["wire_api"] == "responses"
    assert launch.env[provider["env_key"]] == "secret-key-123"
    assert config["analytics"]["enabled"] is False and config["features"]["plugins"] is False
    assert config["check_for_update_on_startup"] is False
    assert launch.env["CODEX_HOME"] == str(tmp_path / "home" / ".codex")


def test_command_preset_templates_arguments_and_exports_the_endpoint(tmp_path: Path) -> None:
    launch = launch_of("command", tmp_path, command=["agent", "--task={prompt}", "{workdir}", "{base_url_v1}", "{x}"])
    assert launch.argv == ["agent", "--task=fix the bug -- now", str(tmp_path / "ws"),
                           "http://127.0.0.1:4000/s/s-abc/v1", "{x}"]
    assert launch.env["OPENAI_BASE_URL"] == "http://127.0.0.1:4000/s/s-abc/v1"
    assert launch.env["OPENAI_API_KEY"] == launch.env["TRACEFLEET_API_KEY"] == "secret-key-123"
    assert launch.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4000/s/s-abc"
    with pytest.raises(ValueError, match="needs a command"):
        launch_of("command", tmp_path)
    with pytest.raises(KeyError, match="known: codex"):
        get_preset("no-such-harness")
    assert get_preset(None) is get_preset("command")
