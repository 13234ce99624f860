"""Cross-field rules of the RolloutJob, written once for both checkers.

Each `Rule` carries the CEL expression the kube-apiserver evaluates (it lands in the CRD as an
`x-kubernetes-validations` entry on the object the rule belongs to), the Python predicate that
`tracefleet validate` and `job_from_yaml` evaluate, and the one message and field path both
report. The two expressions sit side by side so a reviewer sees they say the same thing; the test
table in tests/foundation/test_validate.py proves it against the real apiserver.
"""

from __future__ import annotations

from dataclasses import dataclass
import re
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """One cross-field rule on the object it is attached to (`self` in CEL, the model in Python)."""

    cel: str
    message: str
    # Python mirror of `cel`: gets the validated model instance (and, for transition rules, the old one).
    check: Callable[..., bool]
    # Where the problem is reported, relative to the object (CEL `fieldPath`), e.g. ".uri"; "" = the object.
    field_path: str = ""
    # Transition rules compare with the previous object (CEL `oldSelf`); they only run on update.
    transition: bool = False

    def to_cel_validation(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def has(value: Any) -> bool:
    """CEL `has(self.x)` for a Python model: optional fields left out are None (nulls are pruned too)."""
    return value is not None


def exactly_one(*values: Any) -> bool:
    return sum(1 for v in values if has(v)) == 1


# `s3://BUCKET[/PREFIX]` with a DNS-style bucket name, or anything without a URL scheme (a local path).
BUCKET_URI_RE = "^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
BUCKET_URI_MESSAGE = "must be s3://BUCKET[/PREFIX] or a local path"


def bucket_uri_cel(field: str, optional: bool = False) -> str:
    expr = f"self.{field}.startsWith('s3://') ? self.{field}.matches('{BUCKET_URI_RE}') : !self.{field}.contains('://')"
    return f"!has(self.{field}) || ({expr})" if optional else expr


def bucket_uri_ok(uri: str | None) -> bool:
    if uri is None:
        return True
    if uri.startswith("s3://"):
        return re.search(BUCKET_URI_RE, uri) is not None
    return "://" not in uri
