"""Synthetic sessions written through the real `CaptureWriter`, for tests, the bench and demos.

    s = SyntheticSession(path, "sess-1")
    a = s.call(s.tokens(50))                      # a root call: 50 prompt tokens, a random completion
    b = s.call(s.extend(a, s.tokens(10)))         # next turn: a's prompt + completion + 10 new tokens

Token ids and logprobs are random (seeded); every record is a `CaptureRecord` on disk, exactly what the
proxy writes, so builders read them the way they read real sessions.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tracefleet.contract.capture import CallError, CaptureRecord, CaptureWriter, SpliceInfo, Timings


class SyntheticSession:
    def __init__(self, path: str | os.PathLike[str], session_id: str = "sess", *, mode: str = "exact",
                 seed: int = 0, vocab: int = 4096, model: str = "synthetic") -> None:
        self.path = path
        self.session_id = session_id
        self.mode = mode
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.model = model
        self.records: list[CaptureRecord] = []
        self._writer = CaptureWriter(path)
        self._n = 0
        self._clock = 1_700_000_000.0

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(1, self.vocab, size=n).tolist()

    @staticmethod
    def extend(parent: CaptureRecord, new: list[int]) -> list[int]:
        return list(parent.prompt_ids) + list(parent.completion_ids) + list(new)

    def call(
        self,
        prompt_ids: list[int],
        n_completion: int = 8,
        *,
        completion: list[int] | None = None,
        logprobs: list[float] | None = None,
        parent: CaptureRecord | str | None = None,
        status: str = "ok",
        error_kind: str | None = None,
        drift: bool = False,
        new_root_reason: str | None = None,
        policy_version: int = 0,
        tool_parse_errors: list[str] | None = None,
        finish_reason: str = "stop",
        call_id: str | None = None,
        **extra: Any,
    ) -> CaptureRecord:
        completion = list(completion) if completion is not None else (self.tokens(n_completion) if status != "error" else [])
        if logprobs is None:
            logprobs = (-self.rng.exponential(0.7, size=len(completion))).astype(np.float32).tolist()
        self._n += 1
        self._clock += 1.0
        parent_id = parent.call_id if isinstance(parent, CaptureRecord) else parent
        record = CaptureRecord(
            call_id=call_id or f"{self.session_id}-c{self._n:04d}",
            session_id=self.session_id,
            dialect="openai-chat",
            mode=self.mode,  # type: ignore[arg-type]
            status=status,  # type: ignore[arg-type]
            requested_model=self.model,
            engine_model=self.model,
            policy_version=policy_version,
            timings=Timings(received_at=self._clock, engine_sent_at=self._clock + 0.01,
                            first_token_at=self._clock + 0.05, done_at=self._clock + 0.5),
            prompt_ids=list(prompt_ids),
            completion_ids=completion,
            logprobs=logprobs,
            finish_reason=finish_reason if status == "ok" else None,
            tool_parse_errors=list(tool_parse_errors or []),
            splice=SpliceInfo(parent_call_id=parent_id, drift=drift, new_root_reason=new_root_reason,
                              reused_tokens=0, rendered_tokens=len(prompt_ids)),
            error=CallError(kind=error_kind or "engine_5xx", message="synthetic failure") if status == "error" else None,
            **extra,
        )
        self._writer.append(record)
        self.records.append(record)
        return record

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> SyntheticSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

