"""Unpacking a tarball as data: nothing outside the destination, no device files, no owners or set-id bits of the
archive's.

tarfile's `data` filter (PEP 706) does this from Python 3.11.4. The images' Python is Debian bookworm's 3.11.2, which
has neither the filter nor `TarInfo.replace` (a Harbor session's change set failed to unpack in every pod on the real
node), so there the filter's checks are made here, as CPython makes them.
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path

HAS_FILTERS = hasattr(tarfile, "data_filter")


def _inside(dest: str, path: str) -> bool:
    return os.path.commonpath([dest, os.path.realpath(path)]) == dest


def _data_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """What tarfile.data_filter returns, for a Python without it."""
    name = member.name.lstrip("/" + os.sep)  # an absolute name is taken as relative to dest
    if not _inside(dest, os.path.join(dest, name)):
        raise tarfile.TarError(f"member {name!r} would be extracted outside the destination")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise tarfile.TarError(f"symlink {name!r} points to an absolute path")
        if not _inside(dest, os.path.join(dest, os.path.dirname(name), member.linkname)):
            raise tarfile.TarError(f"symlink {name!r} points outside the destination")
    elif member.islnk() and not _inside(dest, os.path.join(dest, member.linkname)):
        raise tarfile.TarError(f"link {name!r} points outside the destination")
    mode = member.mode & 0o755  # no set-id, sticky or group/other write bits
    if member.isreg() or member.islnk():
        mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    elif member.isdir():
        mode |= 0o700
    elif not member.issym():
        raise tarfile.TarError(f"member {name!r} is a special file")
    data = copy.copy(member)
    data.name, data.mode, data.uid, data.gid, data.uname, data.gname = name, mode, os.getuid(), os.getgid(), "", ""
    return data


def extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, name: str | None = None) -> None:
    """One member into `dest` (as `name`, relative to dest, if given) as data; tarfile.TarError where the `data`
    filter refuses it."""
    if name is not None:
        member = copy.copy(member)
        member.name = name
    if HAS_FILTERS:
        tar.extract(member, dest, filter="data")
    else:
        tar.extract(_data_member(member, os.path.realpath(dest)), dest)


def extract_all(tar: tarfile.TarFile, dest: Path) -> None:
    """Every member into `dest` as data; tarfile.TarError at the first the `data` filter refuses."""
    if HAS_FILTERS:
        tar.extractall(dest, filter="data")
        return
    real = os.path.realpath(dest)
    tar.extractall(dest, members=[_data_member(m, real) for m in tar.getmembers()])
