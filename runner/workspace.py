"""Workspaces: a pristine original per session, a live copy the harness works in, the patch between.

The original (after setup commands) is committed as the *base* commit; the harness gets a copy;
its result is `git diff base` of the live copy (untracked files included, the harness's own index
untouched). Evaluators apply that patch to a fresh copy of the original, so they never see the
live workspace (or anything the harness left running in it) unless asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tracefleet.contract import environment, layout
from tracefleet.contract.job import is_remote
from tracefleet.contract.semantics import SETUP_TIMEOUT_S
from tracefleet.runner.task import Task
from tracefleet.tarballs import extract_all

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "tracefleet",
    "GIT_AUTHOR_EMAIL": "tracefleet@localhost",
    "GIT_COMMITTER_NAME": "tracefleet",
    "GIT_COMMITTER_EMAIL": "tracefleet@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


# Untracked files no session's patch should carry: byte-code and test caches that running the tests
# leaves in the workspace (binary noise in every patch, in the evidence diagnostics read and in the
# bucket). Written to the repository's own .git/info/exclude, so a task's tree is unchanged and files
# the task tracks are still diffed.
UNTRACKED_CACHES = ("__pycache__/", "*.py[cod]", ".pytest_cache/")


class WorkspaceError(RuntimeError):
    pass


@dataclass(frozen=True)
class PreparedWorkspace:
    """A task's workspace on disk, prepared for one session (spec.harness.workspace, tracefleet.contract.job.Workspace,
    is what the job asks for)."""

    original: Path  # pristine, after setup; never touched by the harness
    workdir: Path  # the harness's live copy
    base_commit: str


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_IDENTITY)
    # Keep the user's global config (hooks, signing, templates) out of our plumbing.
    env["HOME"] = env.get(environment.GIT_HOME, "/nonexistent")
    env["GIT_CONFIG_GLOBAL"] = "/dev/null"
    return env


def git(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env={**_git_env(), **(env or {})},
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode(errors="replace")


def _materialize(task: Task, dest: Path) -> None:
    if task.repo and is_remote(task.repo):
        git(dest.parent, "clone", "-q", task.repo, str(dest), timeout=600)
    elif task.repo:
        src = Path(task.repo)
        if not src.is_dir():
            raise WorkspaceError(f"task {task.id}: repo {src} is not a directory")
        shutil.copytree(src, dest, symlinks=True)
    elif task.archive:
        src = Path(task.archive)
        dest.mkdir(parents=True)
        if zipfile.is_zipfile(src):
            with zipfile.ZipFile(src) as zf:
                zf.extractall(dest)
        else:
            with tarfile.open(src) as tf:
                extract_all(tf, dest)
        # An archive of one top-level folder is that folder.
        entries = list(dest.iterdir())
        if len(entries) == 1 and entries[0].is_dir() and not (dest / ".git").exists():
            inner = entries[0]
            for child in list(inner.iterdir()):
                shutil.move(str(child), dest / child.name)
            inner.rmdir()
    else:
        dest.mkdir(parents=True)
        for rel, content in (task.files or {}).items():
            path = (dest / rel).resolve()
            if dest.resolve() not in path.parents:
                raise WorkspaceError(f"task {task.id}: file path {rel!r} escapes the workspace")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)


def _run_setup(task: Task, cwd: Path, timeout_s: float, log: Path) -> None:
    with open(log, "ab") as out:
        for command in task.setup:
            out.write(f"$ {command}\n".encode())
            out.flush()
            try:
                done = subprocess.run(
                    command, shell=True, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                    timeout=timeout_s, check=False, start_new_session=True,
                )
            except subprocess.TimeoutExpired as exc:
                raise WorkspaceError(f"task {task.id}: setup command timed out after {timeout_s}s: {command}") from exc
            if done.returncode != 0:
                raise WorkspaceError(f"task {task.id}: setup command exited {done.returncode}: {command} (see {log})")


def prepare_workspace(task: Task, session_dir: Path, *, setup_timeout_s: float = SETUP_TIMEOUT_S) -> PreparedWorkspace:
    """Build original/ (source + setup, committed as base) and workdir/ (the harness's copy)."""
    session_dir.mkdir(parents=True, exist_ok=True)
    original = session_dir / layout.ORIGINAL
    workdir = session_dir / layout.WORKDIR
    if original.exists():
        shutil.rmtree(original)
    _emptied(workdir)
    _materialize(task, original)
    if not (original / ".git").exists():
        if task.ref:
            raise WorkspaceError(f"task {task.id}: ref {task.ref!r} given but {task.repo or 'the workspace'} is not a git repository")
        git(original, "init", "-q", "-b", "main")
    elif task.ref:
        git(original, "checkout", "-q", "--detach", task.ref)
    _run_setup(task, original, setup_timeout_s, session_dir / layout.SETUP_LOG)
    exclude = original / git(original, "rev-parse", "--git-path", "info/exclude").strip()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a") as f:
        f.write("\n# tracefleet: caches, not changes\n" + "\n".join(UNTRACKED_CACHES) + "\n")
    git(original, "add", "-A")
    git(original, "commit", "-q", "--allow-empty", "-m", f"tracefleet base for task {task.id}")
    base = git(original, "rev-parse", "HEAD").strip()
    _copy_into(original, workdir)
    return PreparedWorkspace(original=original, workdir=workdir, base_commit=base)


def _copy_into(src: Path, dest: Path) -> None:
    """What `src` holds, copied into the folder `dest`, whose own owner, mode and times stay: in a pod it is a volume's
    subPath that the kubelet made as root, which the non-root session program may fill but not chmod or utime
    (copytree's copystat of it fails with EPERM on a real node)."""
    for entry in src.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, dest / entry.name, follow_symlinks=False)


def _emptied(path: Path) -> None:
    """Remove what `path` holds, but not the folder itself: a pod has it bound at the harness's working directory
    (a volume's subPath), and a new folder in its place would not be the one the harness sees."""
    if not path.is_dir() or path.is_symlink():
        path.unlink(missing_ok=True)
        path.mkdir()
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def workspace_patch(workdir: Path, base_commit: str) -> str:
    """Everything the harness changed since base (commits, staged, unstaged, untracked files),
    as a binary git patch. A throwaway index keeps the harness's own index as it left it."""
    index = workdir.parent / ".tracefleet-diff-index"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git(workdir, "read-tree", base_commit, env=env)
        git(workdir, "add", "-A", env=env)
        return git(workdir, "diff", "--cached", "--binary", base_commit, env=env)
    finally:
        index.unlink(missing_ok=True)


def tree_patch(before: Path, after: Path, git_dir: Path) -> str:
    """What changed from folder `before` to folder `after` (neither a repository of ours: a `.git` inside either is
    never read or diffed), as a binary git patch with paths relative to the folders; `git_dir` is made for it."""
    env = {"GIT_DIR": str(git_dir)}
    git(before, "init", "-q", "-b", "main", env=env)
    (git_dir / "info").mkdir(parents=True, exist_ok=True)
    (git_dir / "info" / "exclude").write_text("\n".join(UNTRACKED_CACHES) + "\n")
    git(before, "add", "-A", env={**env, "GIT_WORK_TREE": str(before)})
    git(before, "commit", "-q", "--allow-empty", "-m", "before", env={**env, "GIT_WORK_TREE": str(before)})
    git(after, "add", "-A", env={**env, "GIT_WORK_TREE": str(after)})
    return git(after, "diff", "--cached", "--binary", "HEAD", env={**env, "GIT_WORK_TREE": str(after)})


def fresh_copy(workspace: PreparedWorkspace, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(workspace.original, dest, symlinks=True)
    return dest


def apply_patch(target: Path, patch: str) -> None:
    if not patch.strip():
        return
    patch_file = target.parent / f".{target.name}.patch"
    patch_file.write_text(patch)
    try:
        git(target, "apply", "--binary", "--whitespace=nowarn", str(patch_file))
    finally:
        patch_file.unlink(missing_ok=True)


def restore_paths(target: Path, original: Path, paths: list[str]) -> None:
    """Put protected files (e.g. the tests themselves) back as they were in the original."""
    for rel in paths:
        src, dst = original / rel, target / rel
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif dst.exists() or dst.is_symlink():
            dst.unlink()
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        elif src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
