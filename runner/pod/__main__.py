"""`python -m tracefleet.runner.pod seal|evaluate|harbor-fetch|harbor-report`: the programs of the sealer and
evaluator Jobs the operator creates (same image; harbor-fetch and harbor-report are a Harbor task's evaluator Job's
first and last steps, given the shared folders as arguments). Configuration comes from the environment the operator's child builders set; bucket credentials come from the job's Secret as AWS_* variables (tracefleet.bucket reads them).
The harness pod's program is `tracefleet run --in-pod` (tracefleet.runner.pod.harness_pod).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from tracefleet.bucket import open_bucket
from tracefleet.contract.podenv import EvaluatorEnv, PodEnvError, SealerEnv

from tracefleet.runner.pod.evaluator_job import evaluate_session
from tracefleet.runner.pod.harbor_verifier import fetch, report
from tracefleet.runner.pod.sealer_job import seal


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("seal", "evaluate", "harbor-fetch", "harbor-report"):
        print(__doc__)
        return 2
    code = 0
    try:
        if argv[0] == "seal":
            sealer = SealerEnv.from_env()
            out = seal(open_bucket(sealer.bucket), sealer.batch_seq, sealer.plans)
        elif argv[0] == "harbor-fetch":  # harbor-fetch EVAL_DIR
            env = EvaluatorEnv.from_env()
            problem = fetch(open_bucket(env.bucket), env, Path(argv[1]))
            out = {"fetched": problem is None, "problem": problem}
        elif argv[0] == "harbor-report":  # harbor-report EVAL_DIR VERIFIER_LOGS_DIR
            env = EvaluatorEnv.from_env()
            out, code = report(open_bucket(env.bucket), env, Path(argv[1]), Path(argv[2]))
        else:
            env = EvaluatorEnv.from_env()
            out, code = evaluate_session(open_bucket(env.bucket), env)
    except PodEnvError as exc:
        print(f"tracefleet pod {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 2
    print(out.model_dump_json() if isinstance(out, BaseModel) else json.dumps(out, default=str), flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
