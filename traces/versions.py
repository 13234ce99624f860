"""Per-token policy versions, and what a trainer does with tokens that are too old.

A trace's spans say which policy version sampled each sampled token (a call that straddled a weight
update has one span per version; tracefleet.proxy.versions). `token_versions` spreads them over the tokens:
the version for sampled positions, `NOT_SAMPLED` (-1) elsewhere. A trainer bounds staleness with the
reader's `min_policy_version` (or `max_lag` behind the newest version in the batch): `stale="mask"` takes
the older tokens out of the loss (loss_mask 0, like context), `stale="drop"` leaves out every row that holds
one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

NOT_SAMPLED = -1
Stale = Literal["mask", "drop"]


def token_versions(spans: Iterable[Mapping[str, Any]], length: int) -> np.ndarray:
    """int32[length]: the policy version that sampled each position, NOT_SAMPLED where none did."""
    out = np.full(length, NOT_SAMPLED, dtype=np.int32)
    for s in spans:
        out[s["completion_start"] : s["completion_end"]] = s["policy_version"]
    return out


def stale_bound(versions: np.ndarray, min_policy_version: int | None, max_lag: int | None) -> int | None:
    """The oldest version kept: `min_policy_version`, or `max_lag` behind the newest sampled version, the
    higher of the two; None when neither is set."""
    bounds = [] if min_policy_version is None else [min_policy_version]
    sampled = versions[versions != NOT_SAMPLED]
    if max_lag is not None and sampled.size:
        bounds.append(int(sampled.max()) - max_lag)
    return max(bounds) if bounds else None
