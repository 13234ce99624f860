"""One rank of the two-process TRL run (test_bridges_trl.py, under torchrun --nproc_per_node 2: accelerate on CPU):
a GRPOTrainer fed by TrlRollouts from a job's sealed batches, PolicySync on the engine; each rank writes what it
was handed per step (sessions, groups, the tokens its loss takes) and the syncs it made to OUT/rank-<r>.json.

    python trl_ranks.py BUCKET JOB ENGINE_URL MODEL_DIR OUT STEPS
"""

import json
import sys
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from tracefleet.traces import BatchReader
from tracefleet.trainer.bridges.trl import (GROUP_KEY, SESSION_KEY, PolicySync, TrlRollouts, placeholder_dataset,
                                            session_advantage)
from tracefleet.trainer.grpo import load_policy

bucket, job, engine, model_dir, out, steps = sys.argv[1:7]
rollouts = TrlRollouts(BatchReader(bucket, job, consumer="trl"), follow_options={"idle_exit": True})
given: list[dict[str, Any]] = []


def handed(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    rows = rollouts(prompts, trainer)
    given.append({"sessions": rows[SESSION_KEY], "groups": rows[GROUP_KEY], "step": trainer.state.global_step,
                  "trained_tokens": sum(map(sum, rows["env_mask"]))})
    return rows


sync = PolicySync([engine], Path(out) / "ckpt", rollouts)
config = GRPOConfig(output_dir=str(Path(out) / "trl"), per_device_train_batch_size=4, num_generations=4,
                    max_steps=int(steps), use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                    save_strategy="no", scale_rewards="none", beta=0.0, learning_rate=1e-4, seed=0)
trainer = GRPOTrainer(model=load_policy(model_dir, train_layers=1), reward_funcs=[session_advantage], args=config,
                      train_dataset=placeholder_dataset(groups_per_step=2, steps=int(steps)),
                      processing_class=AutoTokenizer.from_pretrained(model_dir), rollout_func=handed, callbacks=[sync])
trainer.train()
rank = trainer.accelerator.process_index
Path(out, f"rank-{rank}.json").write_text(json.dumps({
    "given": given, "syncs": [r.version for r in sync.reports], "ranks": trainer.accelerator.num_processes}))
# gloo's worker threads outlive a process group nobody destroyed: at exit some runs end in SIGABRT
# ("terminate called without an active exception"; docs/training/trainers.md). The main rank makes the last step's
# engine update after the other rank has finished training: both wait here, so neither tears gloo down while the
# other still holds the group.
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()
