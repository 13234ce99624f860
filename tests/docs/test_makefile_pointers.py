"""The Makefile's comments point at pages and sections that exist: `(docs/PAGE.md, "Section")`, `(README,
"Section")` (a page whose sections moved leaves a newcomer at a dead end)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POINTER = re.compile(r'\((README|docs/[\w/.-]+\.md)(?:, "([^"]+)")?')


def test_every_pointer_in_the_makefile_is_there() -> None:
    comments = "\n".join(line for line in (REPO / "Makefile").read_text().splitlines() if line.lstrip().startswith("#"))
    pointers = POINTER.findall(comments)
    assert pointers
    for page, section in pointers:
        path = REPO / ("README.md" if page == "README" else page)
        assert path.is_file(), f"the Makefile points at {page}, which is not there"
        if section:
            headings = {line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")}
            assert section in headings, f"the Makefile points at {page}, {section!r}: no such section"
