"""Rollout diagnostics: judge how a session earned its reward before a trainer sees it.

`evidence.SessionEvidence` is the one object every diagnostic reads (calls, workspace diff, evaluator,
harness, timings, task), built by `evidence.session_evidence` in the one session lifecycle.
`library` holds the built-in diagnostics, `registry` resolves the ones a RolloutJob lists
(`spec.diagnostics`) and runs them; `base` defines findings and the session's action they decide (flag,
quarantine, drop); `backtest` re-runs diagnostics over sealed batches (`tracefleet diagnose`).
"""
