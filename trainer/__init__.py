"""Trainer side of the loop: what a trainer calls to put new weights into a running job's engine(s).

    from tracefleet.trainer import update_policy
    report = update_policy(["http://vllm:8000"], "/ckpt/step-3", version=3)   # pause (keep), load, label, resume
    print(report.step_seconds(), report.in_flight)

See tracefleet.trainer.control; the CLI beside it is `tracefleet policy`.
"""

from tracefleet.trainer.control import EngineControl, PolicyUpdateFailed, update_policy

__all__ = ["EngineControl", "PolicyUpdateFailed", "update_policy"]
