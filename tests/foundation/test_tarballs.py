"""tracefleet.tarballs unpacks as tarfile's `data` filter does, with the filter (Python >= 3.11.4) and without it (the
images' Python, Debian bookworm's 3.11.2): the same files and modes where it passes (an absolute name taken as
relative to the destination), a tarfile.TarError where it refuses."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from tracefleet import tarballs


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, data: bytes = b"", link: str = ""
           ) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname, info.uid, info.uname = kind, mode, len(data), link, 4242, "someone"
    return info, data


def tarball(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


GOOD = [member("/abs", data=b"y"), member("a", tarfile.DIRTYPE, 0o777), member("a/tool", mode=0o4777, data=b"#!/bin/sh\n"),
        member("a/notes", mode=0o666, data=b"x"), member("a/link", tarfile.SYMTYPE, link="notes")]
REFUSED = {
    "a parent folder": member("../x", data=b"x"),
    "an absolute symlink": member("l", tarfile.SYMTYPE, link="/etc/passwd"),
    "a symlink out": member("l", tarfile.SYMTYPE, link="../../x"),
    "a device": member("dev", tarfile.CHRTYPE),
}


@pytest.fixture(params=[True, False], ids=["with the filter", "without it"])
def filters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param and not tarballs.HAS_FILTERS:
        pytest.fail("this Python has no tarfile filters: the tests' venv needs Python >= 3.11.4")
    monkeypatch.setattr(tarballs, "HAS_FILTERS", request.param)
    return request.param


def test_members_unpack_as_data(filters: bool, tmp_path: Path) -> None:
    path = tarball(tmp_path / "good.tar", *GOOD)
    with tarfile.open(path) as tar:
        tarballs.extract_all(tar, tmp_path / "all")
    with tarfile.open(path) as tar:
        tarballs.extract_member(tar, tar.getmember("a/tool"), tmp_path / "one", "renamed")
    modes = {p.relative_to(tmp_path / "all").as_posix(): stat.S_IMODE(p.lstat().st_mode)
             for p in (tmp_path / "all").rglob("*") if not p.is_symlink()}
    assert modes == {"abs": 0o644, "a": 0o755, "a/tool": 0o755, "a/notes": 0o644}  # no set-id bit, no group/other write
    assert (tmp_path / "all" / "a" / "link").read_bytes() == b"x"
    assert (tmp_path / "one" / "renamed").read_bytes() == b"#!/bin/sh\n"


@pytest.mark.parametrize("what", list(REFUSED))
def test_what_the_data_filter_refuses_is_a_tar_error(filters: bool, what: str, tmp_path: Path) -> None:
    path = tarball(tmp_path / "bad.tar", REFUSED[what])
    with tarfile.open(path) as tar, pytest.raises(tarfile.TarError):
        tarballs.extract_all(tar, tmp_path / "out")
    with tarfile.open(path) as tar, pytest.raises(tarfile.TarError):
        tarballs.extract_member(tar, tar.getmembers()[0], tmp_path / "one")
