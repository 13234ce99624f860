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
The session steps and the checks live in tests/fixtures/harness_runs.py (shared with the exact-mode
harness test and hack/record_fixtures.py).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tracefleet.contract.session import HarnessConfig
from tracefleet.runner.presets import REAL_HARNESSES, get_preset

from fixtures.harness_runs import harness_script, protocol_errors, run_through_proxy_process, session_problems


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_through_proxy(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    scripted_engine.configure(**harness_script(name))
    run = run_through_proxy_process(name, scripted_engine.url, tmp_path)
    assert session_problems(run) == [], run.transcript


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_HARNESSES)
def test_real_harness_reports_wrong_credentials(name: str, harness_binaries, scripted_engine, tmp_path: Path) -> None:
    """A wrong key gets the dialect's 401, which each harness reports as an API error (so the check for
    protocol errors above is not vacuous), nothing runs and nothing is captured."""
    scripted_engine.configure(**harness_script(name))
    # Claude Code retries a 401 ten times with backoff (minutes); one attempt is enough here.
    run = run_through_proxy_process(name, scripted_engine.url, tmp_path, api_key="wrong-" + secrets.token_hex(16),
                                    extra_env={"CLAUDE_CODE_MAX_RETRIES": "0"}, timeout_s=120)
    transcript = run.transcript
    assert not run.timed_out, transcript
    assert protocol_errors(name, run.stdout + "\n" + run.stderr), transcript
    assert "401" in run.stdout + run.stderr, transcript
    assert not (run.workdir / "note.txt").exists(), transcript
    assert run.closed.calls == 0, run.closed


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
    assert get_preset(HarnessConfig().preset) is get_preset("command")  # no preset: the plan says `command`
