"""The Tinker bridge against a real Tinker-API server on this machine: SkyRL's `skyrl.tinker.api` (JAX backend, CPU)
serving the shipped SmolLM2 with a LoRA, fed the sealed batch of a real `tracefleet run` against real vLLM
(sampled at temperature 1, so the engine's logprobs and the server's are of the same distribution).

Prints the server's logprobs of the sampled tokens against vLLM's (max and mean |difference|), the step's metrics,
and the version label vLLM carries after the merged weights went in.

    python bench/tinker_skyrl.py --server http://127.0.0.1:18777 --work /tmp/tinker-skyrl

The server (its own venv, Python 3.12: skyrl[tinker,jax]==0.3.0, jax[cpu], tinker==0.24.1) is started beforehand:

    PATH=<dir with a `uv` that runs `-m MODULE` with the venv's python>:$PATH \\
      VENV/bin/python -m skyrl.tinker.api --base-model MODEL_DIR --backend jax --port 18777
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import yaml

from tracefleet.contract.policy import label_version
from tracefleet.engine.vllm_local import launch
from tracefleet.traces import BatchReader
from tracefleet.trainer import EngineControl
from tracefleet.trainer.bridges import tinker as bridge
from tracefleet.trainer.bridges.rows import groups

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
REWARD = ("import json, pathlib; n = sum(len(p.read_text()) for p in pathlib.Path('.').glob('*.py') "
          "if not p.name.startswith('test_')); print(json.dumps({'reward': n / 1000}))")


def run_job(engine_url: str, work: Path) -> Path:
    import subprocess

    job = {
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "tinker-skyrl"},
        "spec": {
            "inference": {"external": {"baseUrl": engine_url}, "capture": {"mode": "server"}},
            "harness": {"preset": "command", "command": ["python", str(QUICKSTART / "agent.py"), "{prompt}"],
                        "env": {"AGENT_MAX_TURNS": "1", "AGENT_MAX_TOKENS": "32", "AGENT_TEMPERATURE": "1.0"},
                        "sessionTimeoutSeconds": 300},
            "tasks": {"samplesPerTask": 4, "inline": [{
                "id": "add", "prompt": "Write the Python function add(a, b) in calc.py: it returns the sum of a and b.",
                "workspace": {"repo": str(QUICKSTART / "tasks" / "add")}}]},
            "evaluator": {"preset": "command", "command": ["python", "-c", REWARD], "timeoutSeconds": 60},
            "output": {"uri": str(work / "out"), "tracesPerBatch": 4},
            "parallelism": 2,
        },
    }
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    subprocess.run([sys.executable, "-m", "tracefleet.cli", "run", str(work / "job.yaml"), "--work-dir",
                    str(work / "work"), "--engine-url", engine_url], check=True, cwd=work)
    return work / "out"


def main() -> int:
    import tinker

    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--work", required=True, type=Path)
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    vllm = launch(log=a.work / "vllm.log", extra_args=["--override-generation-config", json.dumps({"max_new_tokens": 512})])
    try:
        out = run_job(vllm.url, a.work)
        reader = BatchReader(out, "tinker-skyrl", consumer="tinker")
        batch = reader.read(0)
        model_dir = Path(httpx.get(vllm.url + "/v1/models").json()["data"][0]["root"])
        service = tinker.ServiceClient(base_url=a.server, api_key="tml-local")
        training = service.create_lora_training_client(base_model=str(model_dir), rank=4)
        rows = [r for g in groups(batch) for r in g]
        data = [bridge.datum(r) for r in rows]
        step = bridge.train_step(training, data, loss_fn="importance_sampling", learning_rate=1e-4)
        diffs = []
        for r, lp in zip(rows, step["logprobs"], strict=True):
            on = np.asarray(r.loss_mask[1:]) > 0
            diffs.append(np.abs(np.asarray(lp)[on] - np.asarray(r.logprobs[1:])[on]))
        d = np.concatenate(diffs)
        context = np.concatenate([np.asarray(lp)[np.asarray(r.loss_mask[1:]) == 0] for r, lp in zip(rows, step["logprobs"])])
        print(f"sampled tokens {d.size}: |server - vLLM| logprob max {d.max():.3e} mean {d.mean():.3e}; the server's "
              f"mean logprob on {context.size} context targets {context.mean():.3f} (its own forward, not an echo); "
              f"metrics {step['metrics']}", flush=True)
        weights = bridge.export_weights(service, training, "policy-1", model_dir, a.work / "ckpt" / "policy-1")
        from tracefleet.trainer.control import update_policy

        report = update_policy([vllm.url], weights, 1)
        print(f"merged tensors {sorted(p.name for p in weights.iterdir())}; update {report.seconds:.2f} s; "
              f"vLLM label version {label_version(EngineControl(vllm.url).label())}", flush=True)
    finally:
        vllm.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
