"""Paths of a container's filesystem read through its mount on the host: a link inside it means the container's
root, never the host's."""

from __future__ import annotations

from pathlib import Path

from tracefleet.runner.containers.changes import within


def test_links_resolve_inside_the_mount(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "srv" / "app").mkdir(parents=True)
    (root / "app").symlink_to("/srv/app")  # absolute: the container's /srv/app
    (root / "rel").symlink_to("srv/../srv/app")
    (root / "out").symlink_to("/etc")  # the host has an /etc; the container does not
    (root / "loop").symlink_to("/loop")
    assert within(root, "/app") == root / "srv" / "app"
    assert within(root, "/rel") == root / "srv" / "app"
    assert within(root, "/out") is None and within(root, "/loop") is None and within(root, "/missing") is None
    assert within(root, "/") == root
