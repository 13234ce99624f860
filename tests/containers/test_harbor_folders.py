"""Harbor task folders, read by tracefleet and by Harbor's own models (the `harbor` wheel, in its own venv): the
same verdict on every folder (except where tracefleet is stricter on purpose, tested as such), the same values
parsed, and every problem one line `FILE: field.path: message`; `tracefleet validate` on a folder of tasks, a
tarball of them and a RolloutJob naming them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from fixtures.containers import harbor_site
from fixtures.harbor_tasks import harbor_verdicts, write_task
from tracefleet.harbor.folders import check_task, check_tasks, strip_canary, task_folders

REPO = Path(__file__).resolve().parents[2]
COMPARED = {
    "verifier": ("timeout_sec", "network_mode", "allowed_hosts"),
    "agent": ("timeout_sec",),
    "environment": ("build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "gpus", "network_mode",
                    "allowed_hosts", "os"),
}


def _good_tasks(root: Path) -> list[Path]:
    return [
        write_task(root, "greet"),
        write_task(root, "prebuilt", dockerfile=None, toml='schema_version = "1.4"\n[environment]\n'
                   'docker_image = "ghcr.io/example/tb2-task:1"\ngpus = 1\ncpus = 2.5\n'),
        # Older spellings Harbor still reads: `version`, memory/storage strings, allow_internet.
        write_task(root, "legacy", toml='version = "1.0"\n[verifier]\ntimeout_sec = "300"\n[environment]\n'
                   'memory = "2G"\nstorage = "512M"\nallow_internet = false\n'),
        write_task(root, "allowlist", toml='schema_version = "1.1"\n[environment]\nnetwork_mode = "allowlist"\n'
                   'allowed_hosts = ["pypi.org", "*.pythonhosted.org"]\n[agent]\ntimeout_sec = 60\n'),
    ]


def test_good_folders_read_the_same_as_harbor_reads_them(tmp_path: Path, harbor_python: Path) -> None:
    folders = _good_tasks(tmp_path)
    theirs = harbor_verdicts(harbor_python, folders)
    for folder in folders:
        task, problems = check_task(folder)
        assert problems == [] and task is not None, problems
        assert theirs[str(folder)]["valid"], theirs[str(folder)]
        ours = task.config.model_dump(mode="json")
        for section, keys in COMPARED.items():
            for key in keys:
                assert ours[section][key] == theirs[str(folder)]["config"][section][key], (folder.name, section, key)
    legacy = check_task(tmp_path / "legacy")[0]
    assert legacy is not None and legacy.config.environment.memory_mb == 2048
    assert legacy.config.environment.network_mode == "no-network"
    prebuilt = check_task(tmp_path / "prebuilt")[0]
    assert prebuilt is not None and prebuilt.prebuilt_image == "ghcr.io/example/tb2-task:1"
    assert prebuilt.config.environment.resource_quantities() == {"cpu": "2500m", "nvidia.com/gpu": 1}


def test_bad_folders_are_refused_by_both_each_problem_one_line(tmp_path: Path, harbor_python: Path) -> None:
    bad = {
        "no-instruction": (write_task(tmp_path, "no-instruction", instruction=None),
                           ["no-instruction/instruction.md: missing: the agent would be asked nothing"]),
        "no-test-sh": (write_task(tmp_path, "no-test-sh", test_sh=None),
                       ["no-test-sh/tests/test.sh: missing: the verifier runs it to score the session"]),
        "timeout-text": (write_task(tmp_path, "timeout-text", toml='[verifier]\ntimeout_sec = "soon"\n'),
                         ["timeout-text/task.toml: verifier.timeout_sec: Input should be a valid number, unable to "
                          "parse string as a number; got 'soon'"]),
        "hosts-not-allowlist": (write_task(tmp_path, "hosts-not-allowlist",
                                           toml='[environment]\nallowed_hosts = ["pypi.org"]\n'),
                                ["hosts-not-allowlist/task.toml: environment: allowed_hosts is only valid when "
                                 "network_mode='allowlist'"]),
        "no-environment": (write_task(tmp_path, "no-environment", dockerfile=None),
                           ["no-environment/environment/Dockerfile: missing, and task.toml names no "
                            "environment.docker_image: nothing to run the task in"]),
        "bad-toml": (write_task(tmp_path, "bad-toml", toml="[verifier\n"),
                     ["bad-toml/task.toml: invalid TOML: Expected ']' at the end of a table declaration (at line 1, "
                      "column 10)"]),
    }
    theirs = harbor_verdicts(harbor_python, [folder for folder, _ in bad.values()])
    for name, (folder, expected) in bad.items():
        task, problems = check_task(folder)
        assert task is None and [str(p) for p in problems] == expected, (name, problems)
        assert not theirs[str(folder)]["valid"], (name, theirs[str(folder)])


def test_where_tracefleet_is_stricter_than_harbor_on_purpose(tmp_path: Path, harbor_python: Path) -> None:
    """Harbor's model takes any schema_version and any timeout; we refuse a 2.x folder (a format we cannot
    promise to read right) and a timeout that is not positive, each in one line."""
    cases = {
        write_task(tmp_path, "schema-2", toml='schema_version = "2.0"\n'):
            "schema-2/task.toml: schema_version: unsupported schema_version '2.0': tracefleet reads Harbor task "
            "folders 1.x",
        write_task(tmp_path, "timeout-zero", toml="[verifier]\ntimeout_sec = 0\n"):
            "timeout-zero/task.toml: verifier.timeout_sec: must be a positive number of seconds, got 0.0",
        write_task(tmp_path, "multi-step", toml='[[steps]]\nname = "one"\n'):
            "multi-step/task.toml: steps: multi-step tasks ([[steps]]) are not supported: one session answers one "
            "instruction",
    }
    theirs = harbor_verdicts(harbor_python, list(cases))
    for folder, line in cases.items():
        assert [str(p) for p in check_task(folder)[1]] == [line]
        if folder.name != "multi-step":  # Harbor wants step folders for that one
            assert theirs[str(folder)]["valid"], theirs[str(folder)]


def test_harbors_template_task(tmp_path: Path, harbor_python: Path) -> None:
    """The template `harbor init` copies: Harbor's model and ours parse its task.toml alike; its instruction.md
    is empty, which we refuse (an agent asked nothing), and once written the folder is a valid task for us."""
    template = tmp_path / "template-task"
    shutil.copytree(harbor_site(harbor_python) / "cli" / "template-task", template)
    theirs = harbor_verdicts(harbor_python, [template])[str(template)]
    assert theirs["valid"], theirs
    assert [str(p) for p in check_task(template)[1]] == [
        "template-task/instruction.md: empty: the agent would be asked nothing"]
    (template / "instruction.md").write_text("<!-- harbor-canary GUID 1234 -->\n\nSay hello.\n")
    task, problems = check_task(template)
    assert problems == [] and task is not None
    assert task.instruction == "Say hello.\n" == strip_canary(task.instruction)
    ours = task.config.model_dump(mode="json")
    for section, keys in COMPARED.items():
        for key in keys:
            assert ours[section][key] == theirs["config"][section][key], (section, key)
    assert task.config.verifier.timeout_sec == 900.0 and task.config.environment.build_timeout_sec == 600.0


def test_a_source_folder_and_its_name_filter(tmp_path: Path) -> None:
    for name in ("swe-1", "swe-2", "tb-1"):
        write_task(tmp_path, name)
    (tmp_path / ".git").mkdir()
    (tmp_path / "notes").mkdir()
    assert [p.name for p in task_folders(tmp_path)] == ["swe-1", "swe-2", "tb-1"]
    assert [p.name for p in task_folders(tmp_path, ["swe-*"])] == ["swe-1", "swe-2"]
    assert task_folders(tmp_path / "tb-1") == [tmp_path / "tb-1"]  # one task folder is a source too
    tasks, problems = check_tasks(tmp_path, "tasks", ["nope-*"])
    assert tasks == [] and [str(p) for p in problems] == [
        "tasks: no Harbor task folder matching nope-* (a folder holding task.toml, instruction.md and tests/)"]


def _validate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet", "validate", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_validate_cli_on_task_folders_a_tarball_and_a_job(tmp_path: Path) -> None:
    src = tmp_path / "tasks"
    write_task(src, "good")
    write_task(src, "no-instruction", instruction=None)
    write_task(src, "schema-9", toml='schema_version = "9.1"\n')
    proc = _validate("tasks", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "tasks/no-instruction/instruction.md: missing: the agent would be asked nothing",
        "tasks/schema-9/task.toml: schema_version: unsupported schema_version '9.1': tracefleet reads Harbor task "
        "folders 1.x",
    ]
    with tarfile.open(tmp_path / "tasks.tar.gz", "w:gz") as tar:
        tar.add(src / "good", arcname="good")
    proc = _validate("tasks.tar.gz", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "tasks.tar.gz: ok (1 Harbor task)\n"

    job = yaml.safe_load((REPO / "examples" / "local-command.yaml").read_text())
    job["spec"]["tasks"] = {"harbor": {"uri": "tasks", "include": ["schema-*", "good"]}, "samplesPerTask": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = _validate("job.yaml", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout.splitlines() == [
        "job.yaml: spec.tasks.harbor.uri: tasks/schema-9/task.toml: schema_version: unsupported schema_version "
        "'9.1': tracefleet reads Harbor task folders 1.x"]
    job["spec"]["tasks"]["harbor"]["include"] = ["good"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert _validate("job.yaml", cwd=tmp_path).returncode == 0
    # Valid, and run by the local driver (issue 20; tests/containers/test_harbor_run.py): here it stops at the job's
    # engine, which does not answer (one line), before it builds any image.
    run = subprocess.run([sys.executable, "-m", "tracefleet", "run", "job.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2 and "task image" not in run.stderr, run.stderr
    assert run.stderr.splitlines() == [run.stderr.splitlines()[0]] and run.stderr.startswith(
        "tracefleet run: cannot read the served model from "), run.stderr
    job["spec"]["tasks"]["harbor"]["uri"] = "missing-tasks"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = _validate("job.yaml", cwd=tmp_path)
    assert proc.stdout.splitlines() == ["job.yaml: spec.tasks.harbor.uri: missing-tasks: no such file or directory"]


def test_task_folders_from_an_s3_prefix_and_an_s3_tarball(tmp_path: Path, s3, monkeypatch) -> None:
    """The two remote sources, from a real S3 server (SeaweedFS): a prefix holding task folders, and one tarball."""
    from tracefleet.bucket import open_bucket
    from tracefleet.harbor.sources import open_source

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    bucket_name = s3.create_bucket()
    src = tmp_path / "src"
    write_task(src, "t1")
    write_task(src, "t2", instruction=None)
    bucket = open_bucket(f"s3://{bucket_name}/datasets/tb")
    for path in src.rglob("*"):
        if path.is_file():
            bucket.put(path.relative_to(src).as_posix(), path.read_bytes())
    root = open_source(f"s3://{bucket_name}/datasets/tb", tmp_path / "dl")
    tasks, problems = check_tasks(root, f"s3://{bucket_name}/datasets/tb")
    assert [t.name for t in tasks] == ["t1"]
    assert [str(p) for p in problems] == [
        f"s3://{bucket_name}/datasets/tb/t2/instruction.md: missing: the agent would be asked nothing"]

    with tarfile.open(tmp_path / "tb.tgz", "w:gz") as tar:
        tar.add(src / "t1", arcname="tb2/t1")  # wrapped in one folder, as `tar czf tb2.tgz tb2/` makes it
    open_bucket(f"s3://{bucket_name}").put("tb.tgz", (tmp_path / "tb.tgz").read_bytes())
    root = open_source(f"s3://{bucket_name}/tb.tgz", tmp_path / "dl2")
    assert [t.name for t in check_tasks(root, "tb")[0]] == ["t1"]


def test_a_separate_verifier_environment_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = write_task(tmp_path, "separate", toml='schema_version = "1.4"\n[verifier.environment]\n'
                        'docker_image = "ghcr.io/example/verifier:1"\n')
    assert [str(p) for p in check_task(folder)[1]] == [
        "separate/task.toml: verifier.environment: a separate verifier environment is not supported (tracefleet "
        "verifies in a fresh container of the task's image with the agent's changes applied)"]
