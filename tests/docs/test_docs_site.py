"""The docs site builds as CI would publish it: `mkdocs build --strict` with the pinned tools (docs/requirements.txt,
installed by hack/setup.d/65-docs.sh into their own venv), where a broken link, a link to a missing anchor or a
page left out of mkdocs.yml's nav fails the build; and what it builds is read offline (no script, stylesheet or
font from another host)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS_VENV = Path(os.environ.get("TRACEFLEET_CACHE", Path.home() / ".cache" / "tracefleet")) / "docs" / "venv"
MKDOCS = DOCS_VENV / "bin" / "mkdocs"
REQUIREMENTS = "docs/requirements.txt"
# Tags that make a browser fetch what they name (a <link> but a canonical or alternate one: those only name pages).
FETCHING_TAG = re.compile(r"<(?:script|img|iframe|source|link)\b[^>]*>", re.I)
EXTERNAL = re.compile(r"""\s(?:src|href)=["']?(?:https?:)?//""", re.I)
NAMING_ONLY = re.compile(r"""\srel=["']?(?:canonical|alternate)""", re.I)


def external_assets(page: str) -> list[str]:
    return [tag for tag in FETCHING_TAG.findall(page) if EXTERNAL.search(tag) and not NAMING_ONLY.search(tag)]


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    assert MKDOCS.exists(), f"{MKDOCS} missing: run `bash hack/setup.d/65-docs.sh`"
    assert (DOCS_VENV / "requirements.txt").read_text() == (REPO / REQUIREMENTS).read_text(), (
        f"the docs venv was made from other pins than {REQUIREMENTS}: run `bash hack/setup.d/65-docs.sh`")
    # Material prints a banner about MkDocs 2.0 on every build; it says nothing about this site.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_site_builds_strict_and_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = mkdocs_build(REPO, site)
    assert proc.returncode == 0, proc.stderr
    pages = sorted(site.rglob("*.html"))
    sources = sorted(p for p in (REPO / "docs").rglob("*.md"))
    # Every page of docs/ became a page of the site (the 404 page is mkdocs' own).
    assert len(pages) == len(sources) + 1, (len(pages), len(sources))
    for page in pages:
        found = external_assets(page.read_text())
        assert not found, f"{page.relative_to(site)} loads from another host: {found}"
    # The check itself: material's offline plugin would add a CDN script; a canonical link fetches nothing.
    assert external_assets('<script src="https://unpkg.com/iframe-worker/shim"></script>')
    assert not external_assets('<link rel="canonical" href="https://example.org/x/">')


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """The check the build above relies on: a copy of the site with one bad link and one bad anchor is refused."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ("mkdocs.yml", "CONTRIBUTING.md"):  # the contributing page includes CONTRIBUTING.md
        shutil.copy(REPO / name, root / name)
    page = root / "docs" / "quickstart.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md) and [moved](your-job.md#no-such-heading)\n")
    proc = mkdocs_build(root, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "no-such-heading" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_front_file_links_lead_somewhere(name: str) -> None:
    """The files outside the site (read on a forge or in a checkout) link to files that exist."""
    prose = re.sub(r"`[^`\n]*`", "", (REPO / name).read_text())  # a link shown as code is not one
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
        if not re.match(r"[a-z]+://", target):
            assert (REPO / target).exists(), f"{name} links to {target}, which is not there"


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "LICENSE"])
def test_the_front_files_are_there(name: str) -> None:
    text = (REPO / name).read_text()
    if name == "LICENSE":
        # The Apache License 2.0 as published (pyproject.toml declares Apache-2.0), its appendix included.
        assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
        assert 'Licensed under the Apache License, Version 2.0 (the "License");' in text
    if name == "README.md":
        assert len(text.splitlines()) < 150, "the README is the front door: keep it short, the rest goes to docs/"
