"""The reaper looks for a dead run's labelled containers until none is left, and gives up with one line when one can
never be removed (tracefleet.runner.containers.reaper). The runtime here is a script that answers `ps` and `rm` as a
runtime does: the reaper's loop is what is tested; test_harbor_leaks runs it against podman."""

from __future__ import annotations

import time
from pathlib import Path

from tracefleet.runner.containers import reaper


def _runtime(tmp_path: Path, *, removable: bool) -> list[str]:
    """A runtime with one labelled container, `rm` removing it or refusing."""
    gone = tmp_path / "gone"
    script = tmp_path / "runtime"
    script.write_text(f"""#!/bin/sh
case "$1" in
  ps) [ -e {gone} ] || echo c0ffee ;;
  rm) {"touch " + str(gone) if removable else "echo 'Error: cannot remove container c0ffee' >&2; exit 125"} ;;
esac
""")
    script.chmod(0o755)
    return [str(script)]


def test_a_removable_container_is_removed(tmp_path: Path) -> None:
    assert reaper.reap("tracefleet.io/run=r1", _runtime(tmp_path, removable=True), give_up_after_s=30) == []


def test_a_container_that_cannot_be_removed_ends_the_reaper_with_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(reaper, "AGAIN_AFTER_S", 0.1)
    runtime = _runtime(tmp_path, removable=False)
    started = time.monotonic()
    left = reaper.reap("tracefleet.io/run=r1", runtime, give_up_after_s=1.0)
    assert left == ["c0ffee"] and time.monotonic() - started < 10
    line = reaper.left_line("tracefleet.io/run=r1", runtime, left, 1.0)
    assert line == (f"tracefleet: 1 container(s) labelled tracefleet.io/run=r1 could not be removed in 1s: c0ffee; "
                    f"remove them with `{runtime[0]} rm -f c0ffee`")
