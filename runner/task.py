"""A task as the runner sees it: one prompt plus where its workspace comes from and how to judge it.

Tasks arrive from the RolloutJob (inline entries, JSONL lines) as plain mappings; unknown keys are
kept in `extra` and travel into trace metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracefleet.contract.job import is_remote


class Task(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    prompt: str
    # Where the workspace comes from (at most one; none = an empty git repo).
    repo: str | None = None  # a git repository (path or URL) or a plain directory (made a repo at run time)
    ref: str | None = None  # commit, tag or branch to check out in repo
    archive: str | None = None  # .tar, .tar.gz, .tgz or .zip
    files: dict[str, str] | None = None  # inline files: relative path -> content
    setup: list[str] = Field(default_factory=list)  # shell commands run once in the workspace
    # Test-based evaluation (SWE-bench style). Names as the test runner prints them.
    fail_to_pass: list[str] = Field(default_factory=list, alias="FAIL_TO_PASS")
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    test_command: str | list[str] | None = None
    protected: list[str] = Field(default_factory=list)  # paths restored from the original before testing
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _accept_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "id" not in data:
                for key in ("task_id", "instance_id", "name"):
                    if key in data:
                        data["id"] = str(data[key])
                        break
            if "prompt" not in data:
                for key in ("problem_statement", "instruction", "input"):
                    if key in data:
                        data["prompt"] = data[key]
                        break
            if isinstance(data.get("setup"), str):
                data["setup"] = [data["setup"]]
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Task:
        sources = [s for s in (self.repo, self.archive, self.files) if s]
        if len(sources) > 1:
            raise ValueError(f"task {self.id}: give at most one of repo, archive, files")
        return self

    def resolved(self, base_dir: Path) -> Task:
        """Relative repo/archive paths are relative to the job file's directory."""
        update: dict[str, Any] = {}
        for key in ("repo", "archive"):
            value = getattr(self, key)
            if value and not is_remote(value) and not Path(value).is_absolute():
                update[key] = str((base_dir / value).resolve())
        return self.model_copy(update=update)

    def extra_fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def task_from_api(api_task: Any, base_dir: Path, extra_setup: list[str] | None = None) -> Task:
    """The runner's task from a RolloutJob task (`tracefleet.api` model). Paths are relative to
    base_dir; `metadata.protected` lists files restored from the original before tests run."""
    ws = api_task.workspace
    metadata = dict(api_task.metadata or {})
    task = Task(
        id=api_task.id,
        prompt=api_task.prompt,
        repo=ws.repo if ws else None,
        ref=ws.ref if ws else None,
        archive=ws.archive if ws else None,
        setup=[*((ws.setup or []) if ws else []), *(extra_setup or [])],
        FAIL_TO_PASS=list(api_task.fail_to_pass or []),
        PASS_TO_PASS=list(api_task.pass_to_pass or []),
        test_command=list(api_task.test_command) if api_task.test_command else None,
        protected=list(metadata.get("protected", [])),
        metadata=metadata,
    )
    return task.resolved(base_dir)
