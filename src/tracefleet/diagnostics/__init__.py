"""Rollout diagnostics: judge how a session earned its reward before a trainer sees it (issue 14).

`evidence.SessionEvidence` is the one object every diagnostic reads (calls, workspace diff, evaluator,
harness, timings, task), built by `evidence.session_evidence` in the one session lifecycle.
`library` holds the built-in diagnostics, `registry` resolves the ones a RolloutJob lists
(`spec.diagnostics`) and `verdict` turns findings into the session's action (flag, quarantine, drop).
"""
