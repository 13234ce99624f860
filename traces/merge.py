"""The `prefix-merge` builder: a session's calls form a tree; each maximal exact chain is one trace.

Parent rule: the parent of call j is the earlier call i whose full sequence F_i = prompt_i + completion_i
is the **longest** exact prefix of prompt_j (in token ids). Exactly one such i, or the call starts a new
trace: two or more calls with an identical F_i of that length are *ambiguous* (reported, never guessed).

Speed (bench target ≥ 50 M tokens/s): no Python loop over tokens. Each call's sequence gets positional
polynomial prefix hashes (mod 2^64, one numpy cumsum); a table maps (length, hash of F_i) to calls. For
call j we look up its prompt's prefix hash at the candidate lengths (lengths some earlier F_i has),
longest first, and verify every hash hit with an exact array comparison, so a hash collision can cost
time but never correctness. When the proxy's hint (splice.parent_call_id, or the previous call) is an
exact prefix — the normal case — only the tokens *after* that prefix are hashed, continuing from the
hint's stored hash, so a 32k-token prompt costs one memcmp plus hashing the few new tokens.

Trees become traces: every node is trainable in exactly one trace. A node's *primary* child (the one
with the longest chain below it; ties go to the later call) continues its trace; every other child —
a retry of the same prompt, a parallel branch — starts its own trace whose context is its full prompt
(which already contains the ancestors' tokens, masked), and its chain continues to its own leaf. So
retries never truncate a chain and no sampled token is trained twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracefleet.contract.semantics import AUXILIARY

from tracefleet.traces.calls import Call
from tracefleet.traces.schema import ReconstructionStats

_BASE = np.uint64(0x9E3779B97F4A7C15)
_MASK = (1 << 64) - 1


class _PrefixHasher:
    """H(x[:L]) = sum_{t<L} (x_t + 1) * B^t mod 2^64, so the hash of a prefix is the same whichever
    longer sequence it is read from, and can be continued from a stored value at any offset."""

    def __init__(self) -> None:
        self.pow = np.ones(1, dtype=np.uint64)

    def _powers(self, end: int) -> np.ndarray:
        if end > self.pow.shape[0]:
            size = max(end, 2 * self.pow.shape[0])
            steps = np.full(size - 1, _BASE, dtype=np.uint64)
            pw = np.empty(size, dtype=np.uint64)
            pw[0] = 1
            np.cumprod(steps, out=pw[1:])
            self.pow = pw
        return self.pow

    def prefix_hashes(self, values: np.ndarray, offset: int, start: int) -> np.ndarray:
        """Hashes of seq[:offset + k + 1] for k in range(len(values)), where values = seq[offset:] and
        `start` is H(seq[:offset])."""
        n = values.shape[0]
        pw = self._powers(offset + n)[offset : offset + n]
        terms = values.astype(np.uint64)
        terms += np.uint64(1)
        terms *= pw
        out = np.cumsum(terms, dtype=np.uint64)
        if start:
            out += np.uint64(start)
        return out


def _extends(prompt: np.ndarray, parent: Call) -> bool:
    """prompt[:len(F_parent)] == F_parent, without building F_parent."""
    np_, nc = parent.prompt.shape[0], parent.completion.shape[0]
    if np_ + nc > prompt.shape[0]:
        return False
    return bool(
        np.array_equal(prompt[:np_], parent.prompt) and np.array_equal(prompt[np_ : np_ + nc], parent.completion)
    )


def _re_rendered(prompt: np.ndarray, parent: Call) -> bool:
    """The prompt continues the parent's prompt but not with the tokens the parent sampled: the history was
    re-rendered (server-mode drift). A retry (identical prompt) is not drift."""
    np_ = parent.prompt.shape[0]
    return (
        parent.completion.shape[0] > 0
        and prompt.shape[0] > np_
        and bool(np.array_equal(prompt[:np_], parent.prompt))
    )


@dataclass
class Tree:
    calls: list[Call]  # kept calls, log order
    parent: list[int]  # index into calls, -1 for a root
    root_reason: list[str | None]  # why a root is a root
    retry_of: list[int]  # -1, or the earlier call with the identical prompt
    ambiguous: list[list[str]]  # per call: candidate parent ids when ambiguous


def build_tree(calls: Sequence[Call], stats: ReconstructionStats, dropped_ids: dict[str, str] | None = None) -> Tree:
    hasher = _PrefixHasher()
    full_hash: list[int] = []
    by_full: dict[tuple[int, int], list[int]] = {}
    by_prompt: dict[tuple[int, int], list[int]] = {}
    lengths: list[int] = []  # sorted distinct F lengths seen so far
    pos: dict[str, int] = {}
    parent: list[int] = []
    root_reason: list[str | None] = []
    retry_of: list[int] = []
    ambiguous: list[list[str]] = []
    dropped_ids = dropped_ids or {}
    # Auxiliary calls (tracefleet.contract.semantics): a root that offers no tools in a session whose agent
    # conversation offers them (OpenCode's title generator, a summary request) is not the conversation.
    agent_has_tools = any(c.offers_tools for c in calls)
    conversation_started = False

    for j, call in enumerate(calls):
        prompt = call.prompt
        n_prompt = prompt.shape[0]
        # 1. A hinted parent that is an exact prefix lets us hash only what comes after it.
        base = -1
        hints: list[int] = []
        if call.hint_parent is not None and call.hint_parent in pos:
            hints.append(pos[call.hint_parent])
        if j > 0 and (not hints or hints[0] != j - 1):
            hints.append(j - 1)
        hint_drift = False
        for n, h in enumerate(hints):
            if _extends(prompt, calls[h]):
                base = h
                break
            if n == 0 and call.hint_parent is not None and h == pos.get(call.hint_parent):
                hint_drift = True  # the proxy's parent is not an exact prefix: drift
            elif _re_rendered(prompt, calls[h]):
                hint_drift = True  # server mode: the engine re-rendered what it had sampled
        if base >= 0:
            lo = calls[base].full_len
            start_hash = full_hash[base]
            tail = np.concatenate([prompt[lo:], call.completion])
            hs = hasher.prefix_hashes(tail, lo, start_hash)

            def hash_at(length: int, lo: int = lo, start_hash: int = start_hash, hs: np.ndarray = hs) -> int:
                return start_hash if length == lo else int(hs[length - lo - 1])

            first = bisect.bisect_left(lengths, lo)
        else:
            seq = np.concatenate([prompt, call.completion])
            hs = hasher.prefix_hashes(seq, 0, 0)

            def hash_at(length: int, hs: np.ndarray = hs) -> int:
                return int(hs[length - 1])

            first = 0
        # 2. The longest earlier F that is an exact prefix of the prompt; all of that length are candidates.
        found: list[int] = []
        last = bisect.bisect_right(lengths, n_prompt)
        for k in range(last - 1, first - 1, -1):
            length = lengths[k]
            ids = by_full.get((length, hash_at(length)))
            if not ids:
                continue
            found = [i for i in ids if i == base or _extends(prompt, calls[i])]
            if found:
                break
        if hint_drift or (call.drift and len(found) == 1):
            # Whatever exact parent remains (an earlier, shorter prefix) is safe; the chain through the
            # drifted call is split there and never trained across.
            stats.drift_splits += 1
        if len(found) == 1:
            parent.append(found[0])
            root_reason.append(None)
            ambiguous.append([])
        else:
            parent.append(-1)
            if len(found) > 1:
                reason = "ambiguous"
                ambiguous.append([calls[i].call_id for i in found])
                stats.ambiguous += 1
                stats.ambiguous_calls.append({"call_id": call.call_id, "candidates": ambiguous[-1]})
            else:
                ambiguous.append([])
                hinted = call.hint_parent
                if agent_has_tools and not call.offers_tools:
                    reason = AUXILIARY
                elif hint_drift or call.drift:
                    reason = "drift"
                elif hinted is not None and hinted in dropped_ids:
                    reason = "parent_dropped"
                elif call.new_root_reason:
                    reason = call.new_root_reason
                elif not conversation_started:
                    reason = "session_start"  # the first call of the agent's conversation
                else:
                    reason = "no_prefix_match"
            root_reason.append(reason)
            stats.new_roots[reason] = stats.new_roots.get(reason, 0) + 1
        conversation_started = conversation_started or root_reason[-1] != AUXILIARY
        # 3. Retries: an earlier call with the identical prompt (siblings, each its own trace).
        pkey = (n_prompt, hash_at(n_prompt))
        same = [i for i in by_prompt.get(pkey, ()) if np.array_equal(calls[i].prompt, prompt)]
        retry_of.append(same[0] if same else -1)
        if same:
            stats.retries += 1
        by_prompt.setdefault(pkey, []).append(j)
        # 4. Register F_j.
        fh = int(hs[-1])
        full_hash.append(fh)
        flen = call.full_len
        by_full.setdefault((flen, fh), []).append(j)
        k = bisect.bisect_left(lengths, flen)
        if k == len(lengths) or lengths[k] != flen:
            lengths.insert(k, flen)
        pos[call.call_id] = j
    return Tree(list(calls), parent, root_reason, retry_of, ambiguous)


def chains(tree: Tree) -> list[tuple[list[int], int]]:
    """Maximal chains as (call indices, branched-from index or -1), in order of their first call."""
    n = len(tree.calls)
    children: list[list[int]] = [[] for _ in range(n)]
    for j, p in enumerate(tree.parent):
        if p >= 0:
            children[p].append(j)
    height = [1] * n
    for j in range(n - 1, -1, -1):  # children always come later in the log than their parent
        if children[j]:
            height[j] = 1 + max(height[c] for c in children[j])
    primary = [-1] * n
    for j in range(n):
        if children[j]:
            primary[j] = max(children[j], key=lambda c: (height[c], c))
    starts = [j for j in range(n) if tree.parent[j] < 0 or primary[tree.parent[j]] != j]
    out: list[tuple[list[int], int]] = []
    for s in starts:
        chain = [s]
        while primary[chain[-1]] >= 0:
            chain.append(primary[chain[-1]])
        out.append((chain, tree.parent[s]))
    return out
