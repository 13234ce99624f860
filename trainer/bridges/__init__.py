"""Bridges from tracefleet's sealed batches into the trainers people run, one module per trainer:

- `trl`: `TrlRollouts`, a `rollout_func` for `trl.GRPOTrainer`, and `PolicySync`, the callback that puts each
  step's weights into the job's engine(s)
- `tinker`: batches as `tinker.Datum`s and a `forward_backward` + `optim_step` loop against a Tinker-API server
- `verl`, `miles`, `prime_rl`: a batch as each project's rollout type (verl's `AgentLoopOutput`, Miles' `Sample`,
  prime-rl's `TrainingSample`)

Every bridge reads rows through `rows.rollouts` / `rows.groups`, which take them from `Batch.tensors()` and
`Batch.table` (the same rows, in the same order): what the reader leaves out of training (auxiliary, quarantined
and infrastructure-failed traces, `trained` False) never reaches a trainer, and a group left with fewer than two
sessions trains nothing. Each output carries its row's session id (verl's `extra_fields`, Miles' `metadata`, TRL's
`tracefleet_session`) or, where the type has no room for it (Tinker's Datum, prime-rl's TrainingSample), is the
one at its position in `rows.trained_rollouts(batch)`. Nothing here
imports a trainer's package at import time (docs/training/trainers.md).
"""
