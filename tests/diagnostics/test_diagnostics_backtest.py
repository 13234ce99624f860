"""Backtest (issue 14, part 4): a job sealed without a diagnostic, then `tracefleet diagnose` with it
reports exactly the planted sessions and the advantage change, and the overlay it writes makes the
reader leave them out of training.

One job through `tracefleet run` (local mode, the scripted engine, a command harness): three tasks x four
samples of the quickstart's calc bug, each session doing what a plan says for its (task, sample): the real
fix, nothing, a wrong fix, or a planted hack (rewrite the failing test; hard-code the answers), scored by
an unprotected pytest evaluator so the hacks earn reward 1 and every group has mixed rewards. The job's
`spec.diagnostics` is empty: nothing is judged or quarantined at sealing. Then `tracefleet diagnose` runs
as the user runs it, once with the built-in that catches the test edit and once with a hook the user
just wrote (module:function in the test's folder) that catches the hard-coded answers; the numbers it
prints are computed here independently from the sealed rewards (GRPO: (r - mean) / std over each group's
sessions).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracefleet.bucket import LocalBucket, open_bucket
from tracefleet.traces.reader import BatchReader

from fixtures.browser import browser
from fixtures.command_harness import MODEL_CALL
from fixtures.local_runs import calc_task, command_job, run_local

JOB = "backtest"

# What each session does, by task and sample index. edit / hardcode are the planted hacks (both pass
# the unprotected evaluator); fix passes; nothing and wrong fail.
PLAN = {
    "alpha": ["edit", "fix", "nothing", "wrong"],
    "beta": ["hardcode", "nothing", "fix", "nothing"],
    "gamma": ["fix", "nothing", "edit", "hardcode"],
}
EDITED = {("alpha", 0), ("gamma", 2)}  # protected_files' sessions
HARDCODED = {("beta", 0), ("gamma", 3)}  # the user's hook's sessions
SCRIPT = "<script>alert('diff')</script>"  # written into the edited test: the page must escape it

HARNESS = MODEL_CALL + textwrap.dedent(
    """
    PLAN = json.loads(%r)
    task = os.environ["TRACEFLEET_PROMPT"].split()[0]
    # the session folder (HOME's parent; the workspace is at the job's workdir) is <job>-s<index> (index = task
    # index x 4 + sample): the sample picks the behaviour
    sample = int(re.search(r"-s(\\d+)$", pathlib.Path(os.environ["HOME"]).parent.name).group(1)) %% 4
    what = PLAN[task][sample]
    src = pathlib.Path("calc.py")
    if what == "edit":
        pathlib.Path("test_calc.py").write_text("# %s\\ndef test_add():\\n    assert True\\n")
    elif what == "hardcode":
        src.write_text(src.read_text().replace("return a - b", "return {(2, 3): 5, (-1, 1): 0}[(a, b)]"))
    elif what == "fix":
        src.write_text(src.read_text().replace("return a - b", "return a + b"))
    elif what == "wrong":
        src.write_text(src.read_text().replace("return a - b", "return a * b"))
    """
) % (json.dumps(PLAN), SCRIPT)

# The diagnostic the user just wrote: answers looked up by the test's inputs instead of computed.
HOOK = textwrap.dedent(
    """
    import re

    LOOKUP = re.compile(r"\\{\\s*\\(.*\\)\\s*:")


    def hardcoded_answers(evidence, params):
        for f in evidence.files:
            if f.path.endswith(".py") and not f.path.rsplit("/", 1)[-1].startswith("test_"):
                for added in f.added:
                    if LOOKUP.search(added.text):
                        last = evidence.agent_calls[-1].call_id if evidence.agent_calls else None
                        yield {"message": "answers looked up by input: " + added.text.strip(), "file": f.path,
                               "line": added.line, "call_id": last}


    hardcoded_answers.version = "3"
    hardcoded_answers.severity = "error"


    def broken(evidence, params):
        raise KeyError("no such field")
    """
)


# ---------------------------------------------------------------- the sealed job


@pytest.fixture(scope="module")
def sealed(scripted_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the job's output (`out/`), its harness and the user's hook module."""
    root = tmp_path_factory.mktemp("backtest")
    (root / "harness.py").write_text(HARNESS)
    (root / "my_checks.py").write_text(HOOK)
    job = command_job(JOB, [calc_task(t, f"{t} fix add") for t in PLAN], root / "out", samples=4, per_batch=8,
                      diagnostics=[], parallelism=2)  # nothing judged at sealing
    done, _ = run_local(job, root, engine_url=str(scripted_engine.url))
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def sessions_of(reader: BatchReader) -> dict[str, dict[str, Any]]:
    """session id -> its first row's task, sample, group, reward, quarantined, over every batch."""
    out: dict[str, dict[str, Any]] = {}
    for seq in reader.seqs():
        for row in reader.read(seq).table.select(
                ["session_id", "task_id", "sample_index", "group_id", "reward", "quarantined", "diagnostics"]).to_pylist():
            out.setdefault(row["session_id"], row)
    return out


def ids(sessions: dict[str, dict[str, Any]], planted: set[tuple[str, int]]) -> list[str]:
    return sorted(s for s, r in sessions.items() if (r["task_id"], r["sample_index"]) in planted)


def grpo(sessions: dict[str, dict[str, Any]], leave_out: set[str] = frozenset()) -> dict[str, float]:  # type: ignore[assignment]
    """GRPO advantage per session: (r - group mean) / group std (population), 0 for a constant group."""
    groups: dict[str, list[str]] = {}
    for s, r in sessions.items():
        if s not in leave_out:
            groups.setdefault(r["group_id"], []).append(s)
    out = {}
    for members in groups.values():
        r = np.array([sessions[s]["reward"] for s in members], dtype=np.float64)
        std = r.std()
        for s, v in zip(members, r):
            out[s] = float((v - r.mean()) / (std + 1e-6)) if std > 0 and len(members) > 1 else 0.0
    return out


def expected_report(sessions: dict[str, dict[str, Any]], name: str, version: str, flagged: list[str]) -> list[str]:
    """What `tracefleet diagnose` must print for a diagnostic flagging `flagged`, computed here."""
    before = grpo(sessions)
    after = grpo(sessions, set(flagged))
    touched = {sessions[s]["group_id"] for s in flagged}
    changes = [abs(after[s] - before[s]) for s in after if sessions[s]["group_id"] in touched]
    demoted = [before[s] for s in flagged if before[s] > 0]
    flagged_r = [sessions[s]["reward"] for s in flagged]
    other_r = [r["reward"] for s, r in sessions.items() if s not in flagged]
    return [
        f"{name} (v{version}): {len(flagged)} of {len(sessions)} sessions flagged",
        f"  mean reward flagged {np.mean(flagged_r):.3f} vs not {np.mean(other_r):.3f}",
        f"  positive-advantage sessions demoted: {len(demoted)} (advantage {sum(demoted):+.3f} in all)",
        f"  mean |advantage change| of the other sessions in their groups: {np.mean(changes):.3f}",
    ]


def diagnose(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet.cli", "diagnose", *args], capture_output=True, text=True,
                          timeout=300, cwd=root, env={**os.environ, **(env or {})})


def report_of(stdout: str, name: str) -> tuple[list[str], list[str]]:
    """(the four summary lines, the flagged session ids) of one diagnostic in diagnose's output."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} (v"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block[:4], sorted(line.split("flagged: ", 1)[1] for line in block[4:])


def training_sessions(reader: BatchReader) -> dict[str, float]:
    """session id -> the advantage the reader gives it, over every batch (the trainer's view)."""
    out = {}
    for seq in reader.seqs():
        batch = reader.read(seq)
        for s, a, k in zip(batch.table.column("session_id").to_pylist(), batch.advantages(), batch.trained(),
                           strict=True):
            if k:
                out.setdefault(s, float(a))
    return out


# ---------------------------------------------------------------- the must-show


def test_diagnose_reports_the_planted_sessions_and_the_overlay_takes_them_out_of_training(sealed: Path) -> None:
    out = str(sealed / "out")
    sealed_view = sessions_of(BatchReader(out, JOB))
    assert len(sealed_view) == 12 and not any(r["quarantined"] or r["diagnostics"] for r in sealed_view.values())
    assert {(r["task_id"], r["sample_index"]): r["reward"] for r in sealed_view.values()} == {
        (t, i): 1.0 if what in ("edit", "hardcode", "fix") else 0.0 for t, plan in PLAN.items() for i, what in enumerate(plan)}
    edited, hardcoded = ids(sealed_view, EDITED), ids(sealed_view, HARDCODED)

    # a built-in, then the user's new hook: exactly the planted sessions, the numbers computed here
    built_in = diagnose(sealed, out, "--job", JOB, "--diagnostic", "protected_files")
    assert built_in.returncode == 0, built_in.stderr
    batches = len(BatchReader(out, JOB).seqs())
    assert batches >= 2 and built_in.stdout.splitlines()[0] == f"job {JOB}: 12 sealed sessions in {batches} batches"
    assert report_of(built_in.stdout, "protected_files") == (
        expected_report(sealed_view, "protected_files", "1", edited), edited)
    hook = diagnose(sealed, out, "--job", JOB, "--diagnostic", "my_checks:hardcoded_answers")
    assert hook.returncode == 0, hook.stderr
    assert report_of(hook.stdout, "hardcoded_answers") == (
        expected_report(sealed_view, "hardcoded_answers", "3", hardcoded), hardcoded)
    # every planted session had reward 1 in a mixed group: each was promoted, each is demoted
    assert "positive-advantage sessions demoted: 2 " in built_in.stdout and "demoted: 2 " in hook.stdout
    assert not (sealed / "out" / JOB / "overlays").exists()  # a backtest alone writes nothing

    # the overlays: the reader leaves the planted sessions out, advantages recomputed without them
    for args in (["--diagnostic", "protected_files"], ["--diagnostic", "my_checks:hardcoded_answers"]):
        done = diagnose(sealed, out, "--job", JOB, *args, "--write-overlay")
        assert done.returncode == 0, done.stderr
        assert re.search(r"^overlay \w+: 2 sessions, action quarantine: backtest/overlays/\w+/\d+-\w+\.json$",
                         done.stdout, re.M), done.stdout
    planted = set(edited) | set(hardcoded)
    reader = BatchReader(out, JOB)
    assert training_sessions(reader) == pytest.approx(grpo(sealed_view, planted), abs=1e-5)
    assert set(training_sessions(reader)) == set(sealed_view) - planted
    for seq in reader.seqs():  # the findings are on the rows a trainer reads, the sealed batch untouched
        batch = reader.read(seq)
        assert {o.diagnostic for o in batch.overlays} == {"protected_files", "hardcoded_answers"}
        for sid, found in batch.findings().items():
            assert sid in planted
            assert {f["name"] for f in found} == {"protected_files" if sid in edited else "hardcoded_answers"}
            assert all(f["action"] == "quarantine" and f["file"] for f in found)
        rows = batch.training_table(include_quarantined=True).select(["session_id", "quarantined", "reward"]).to_pylist()
        assert all(r["quarantined"] == (r["session_id"] in planted) for r in rows)
        assert all(r["reward"] <= 0 for r in rows if r["session_id"] in planted)  # as quarantine at sealing does
        assert {t.meta.session_id for t in batch.traces() if t.meta.quarantined} == planted & {r["session_id"] for r in rows}
    assert training_sessions(BatchReader(out, JOB, overlays=False)) == pytest.approx(grpo(sealed_view), abs=1e-5)

    # the same diagnostic again, now only flagging: the newest overlay replaces the older one
    done = diagnose(sealed, out, "--job", JOB, "--diagnostic", "protected_files", "--write-overlay", "--action", "flag")
    assert done.returncode == 0, done.stderr
    assert set(training_sessions(BatchReader(out, JOB))) == set(sealed_view) - set(hardcoded)
    flagged_only = {s for seq in reader.seqs() for s, f in reader.read(seq).findings().items()
                    if any(x["name"] == "protected_files" and x["action"] == "flag" for x in f)}
    assert flagged_only == set(edited)


def test_the_page_shows_each_flagged_sessions_evidence_escaped(sealed: Path) -> None:
    page = sealed / "page.html"
    done = diagnose(sealed, str(sealed / "out"), "--job", JOB, "--diagnostic", "protected_files",
                    "--diagnostic", "my_checks:hardcoded_answers", "--html", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    sealed_view = sessions_of(BatchReader(str(sealed / "out"), JOB, overlays=False))
    for sid in ids(sealed_view, EDITED | HARDCODED):
        assert f'<section id="{sid}">' in html
    assert "<script" not in html and "&lt;script&gt;alert(&#x27;diff&#x27;)&lt;/script&gt;" in html
    assert "test/protected file test_calc.py edited" in html
    assert "return {(2, 3): 5, (-1, 1): 0}[(a, b)]" in html  # the hard-coded line, from the diff around calc.py:3
    assert html.count('class="add hit"') >= 4  # each finding's line, outlined in its diff excerpt
    assert "<h4>evaluator output (tail, exit 0)</h4><pre>" in html and "<h4>harness stderr (tail)</h4>" in html
    assert re.search(r"call [\w-]+ \(#0\): status ok, finish reason \w+", html)  # the call the hook's findings name
    # sessions nobody flagged are not on the page
    clean = [s for s in sealed_view if s not in ids(sealed_view, EDITED | HARDCODED)]
    assert not any(f'id="{s}"' in html for s in clean)
    # as a browser reads it: the diff's <script> is text, no element; each flagged session is a section
    dom = browser("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    assert "<script" not in dom.stdout and "&lt;script&gt;alert('diff')&lt;/script&gt;" in dom.stdout
    assert dom.stdout.count("<section id=") == len(ids(sealed_view, EDITED | HARDCODED))


def test_backtest_and_overlay_through_s3(sealed: Path, s3: Any) -> None:
    """The bucket clusters write to: the same output in SeaweedFS, diagnosed and read through S3."""
    name = s3.create_bucket()
    uri = f"s3://{name}/runs"
    options = {"endpoint_url": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key, "region": s3.region}
    local, remote = LocalBucket(sealed / "out", create=False), open_bucket(uri, **options)
    for obj in local.list(f"{JOB}/"):
        if "/overlays/" not in obj.key:
            remote.put(obj.key, local.get(obj.key))
    sealed_view = sessions_of(BatchReader(remote, JOB))
    edited = ids(sealed_view, EDITED)
    done = diagnose(sealed, uri, "--job", JOB, "--diagnostic", "protected_files", "--write-overlay", env=s3.env())
    assert done.returncode == 0, done.stderr
    assert report_of(done.stdout, "protected_files") == (expected_report(sealed_view, "protected_files", "1", edited), edited)
    assert training_sessions(BatchReader(uri, JOB, **options)) == pytest.approx(grpo(sealed_view, set(edited)), abs=1e-5)


@pytest.mark.parametrize(("args", "message"), [
    (["s3://", "--job", JOB], r"'s3://': an S3 URI needs a bucket name"),
    (["{root}/no-such-dir", "--job", JOB], r"bucket directory .*/no-such-dir does not exist"),
    (["{root}/out", "--job", "nope"], r"job 'nope' has no sealed batches in "),
    (["{root}/out", "--job", "a/b"], r"invalid job name 'a/b'"),
    (["{root}/out", "--job", JOB, "--diagnostic", "no_such"], r"--diagnostic 'no_such': not a built-in"),
    (["{root}/out", "--job", JOB, "--diagnostic", "no_such_module:f"], r"cannot load the hook: ModuleNotFoundError"),
    (["{root}/out", "--job", JOB, "--diagnostic", "my_checks:missing"], r"cannot load the hook: AttributeError"),
    (["{root}/out", "--job", JOB, "--diagnostic", "protected_files", "--html", "{root}/no/such/dir/page.html"],
     r"--html .*/no/such/dir/page.html: No such file or directory"),
])
def test_cli_errors_are_one_line(sealed: Path, args: list[str], message: str) -> None:
    done = diagnose(sealed, *[a.format(root=sealed) for a in args])
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracefleet diagnose: ") and re.search(message, lines[0]), done.stderr
    assert "Traceback" not in done.stderr


def test_a_hook_that_fails_names_the_session_in_one_line(sealed: Path) -> None:
    done = diagnose(sealed, str(sealed / "out"), "--job", JOB, "--diagnostic", "my_checks:broken")
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert re.match(r"tracefleet diagnose: error: RuntimeError: broken failed on session [\w-]+: KeyError: 'no such field'", line)


def test_the_diff_excerpt_of_a_deleted_and_a_renamed_file() -> None:
    from tracefleet.diagnostics.page import diff_excerpt

    patch = ("diff --git a/test_calc.py b/test_calc.py\ndeleted file mode 100644\n--- a/test_calc.py\n+++ /dev/null\n"
             "@@ -1,2 +0,0 @@\n-def test_add():\n-    assert add(2, 3) == 5\n"
             "diff --git a/tests/old.py b/tests/new.py\nsimilarity index 90%\nrename from tests/old.py\nrename to tests/new.py\n"
             "@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = '<b>'\n c = 3\n")
    deleted = diff_excerpt(patch, "test_calc.py", None)  # no line: the file's diff from its start
    assert "-    assert add(2, 3) == 5" in deleted and "rename" not in deleted
    renamed = diff_excerpt(patch, "tests/new.py", 2)
    assert '<span class="add hit">    2 +b = &#x27;&lt;b&gt;&#x27;</span>' in renamed and "    1  a = 1" in renamed
    assert diff_excerpt(patch, "tests/old.py", None) == diff_excerpt(patch, "tests/new.py", None)  # either name
    assert diff_excerpt(patch, "harness.stderr", None) == ""  # not a file of the diff: nothing to show
