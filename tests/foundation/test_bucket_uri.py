"""The one question "does this text name a URI scheme" (tracefleet.bucket.uri_scheme), and its malformed case, as
`tracefleet run --output` and `tracefleet train --output` ask it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracefleet.bucket import malformed_uri, uri_scheme


@pytest.mark.parametrize("text, scheme, malformed", [
    ("s3://bucket/prefix", "s3", False),
    ("file:///tmp/out", "file", False),
    ("s3:/bucket", "s3", True),
    ("s3:bucket", "s3", True),
    ("gs:", "gs", True),
    ("out/traces", None, False),
    ("/abs/out", None, False),
    ("C:/out", None, False),  # a drive letter, not a scheme
    (Path("relative/dir"), None, False),
])
def test_scheme_and_malformed(text: str | Path, scheme: str | None, malformed: bool) -> None:
    assert uri_scheme(text) == scheme
    assert malformed_uri(text) is malformed
