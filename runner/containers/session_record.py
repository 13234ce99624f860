"""What a session that ran in a container of its task's image leaves for its judge (the harbor evaluator): where the
container keeps the tools, which container it was, what the agent changed. The place that runs it
(tracefleet.runner.containers.place) writes them; the evaluator reads them without importing the place."""

from __future__ import annotations

import json
from pathlib import Path

TOOLS_DIR = "/opt/tracefleet"  # inside the container: node, the forwarder, the proxy's socket
CONTAINER_RECORD = "container.json"  # in the session's artifacts: which container the session ran in
CHANGE_SET = "change-set"  # in the session's artifacts until it was judged: what the agent changed (changes.py)


def container_of(session_dir: Path) -> dict[str, str] | None:
    """The container a session ran in ({"name", "image", "workdir", "home"}), as its place recorded it, or None."""
    record = Path(session_dir) / CONTAINER_RECORD
    return json.loads(record.read_text()) if record.is_file() else None
