"""RolloutJob manifests as YAML files: what a person writes and `tracefleet run|validate` read.

(The model itself is on the contract floor, tracefleet.contract.job, which imports no YAML library.)
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tracefleet.contract.job import RolloutJob


def job_from_yaml(text: str) -> RolloutJob:
    """The one RolloutJob a YAML text holds."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) != 1:
        raise ValueError(f"expected one YAML document with a RolloutJob, found {len(docs)}")
    return RolloutJob.from_manifest(docs[0])


def load_job(path: str | Path) -> RolloutJob:
    return job_from_yaml(Path(path).read_text())


def job_to_yaml(job: RolloutJob) -> str:
    return yaml.safe_dump(job.to_manifest(), sort_keys=False)
