"""How a plan reaches a pod: as files in a folder the operator mounts, never as one environment variable.

Linux refuses to start a process with any single environment entry over 128 KiB (MAX_ARG_STRLEN), and a valid job's
plan can be larger: a task's prompt may hold 262,144 characters, a sealer's plans cover every session of its batch
(1,024 of them for one group at the schema's most samples per task). So the operator writes each plan document (its
JSON) as parts into ConfigMaps, at most CONFIG_MAP_BYTES each (the API server refuses a ConfigMap over 1 MiB), mounts
them read-only at the folder named here, and points the pod program at it (tracefleet.contract.podenv.PLAN_DIR);
the program joins the parts in name order. Any plan fits: a larger one takes more parts and more ConfigMaps.
"""

from __future__ import annotations

from pathlib import Path

# where the operator mounts a container's plan: the session's SessionPlan (a sealer's: its sessions' plans; a proxy
# sidecar's: its SidecarPlan)
PLAN_FOLDER = "/etc/tracefleet/plan"
# the documents, by name: a part's file is `<document>.<part number, 4 digits>`
SESSION_PLAN = "session-plan"
SESSION_PLANS = "session-plans"
SIDECAR_PLAN = "sidecar-plan"  # a harness pod's proxy sidecar's (tracefleet.contract.proxy_plan.SidecarPlan)
# One part's most, in UTF-8 bytes; a ConfigMap holds as many parts as fit in CONFIG_MAP_BYTES (the API server's
# limit is 1 MiB of data, and the whole object must fit its request limit: room is left for names and metadata).
PART_BYTES = 512 * 1024
CONFIG_MAP_BYTES = 1000 * 1024


def split_parts(document: str, text: str, limit: int = PART_BYTES) -> dict[str, str]:
    """`text` as parts of at most `limit` UTF-8 bytes, cut between characters, by file name in order."""
    data = text.encode()
    parts: dict[str, str] = {}
    start = 0
    while start < len(data) or not parts:
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # inside a character: cut before it
            end -= 1
        parts[f"{document}.{len(parts):04d}"] = data[start:end].decode()
        start = end
    return parts


def read_parts(folder: Path, document: str) -> str:
    """The document whose parts are in `folder` (OSError when there is none)."""
    files = sorted(folder.glob(f"{document}.[0-9][0-9][0-9][0-9]"))
    if not files:
        raise FileNotFoundError(f"no {document}.NNNN file in {folder}")
    return "".join(f.read_text() for f in files)
