"""Bridges from tracefleet's sealed batches into the trainers people run, one module per trainer:

- `trl`: `TrlRollouts`, a `rollout_func` for `trl.GRPOTrainer`, and `PolicySync`, the callback that puts each
  step's weights into the job's engine(s)
- `tinker`: batches as `tinker.Datum`s and a `forward_backward` + `optim_step` loop against a Tinker-API server
- `verl`, `miles`, `prime_rl`: a batch as each project's rollout type (verl's `AgentLoopOutput`, Miles' `Sample`,
  prime-rl's `TrainingSample`)

Every bridge reads rows through `rows.rollouts` / `rows.groups`, which take them from `Batch.tensors()` and
`Batch.training_table()`: what the reader leaves out of training (auxiliary, quarantined and infrastructure-failed
traces) never reaches a trainer, and a group left with fewer than two sessions trains nothing. Nothing here
imports a trainer's package at import time (docs/training/trainers.md).
"""
