"""Directories as one deterministic .tar.gz (put_dir / get_dir of a Store), safe to extract."""

from __future__ import annotations

import gzip
import logging
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)


class UnsafeArchive(ValueError):
    """A directory archive has a member that would land outside the target directory."""


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.DirEntry]]:
    """Entries under root in sorted order, not following symlinks."""
    with os.scandir(root / rel if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        yield name, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(root, name)


def _inside(root: Path, path: str) -> bool:
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


def write_dir_archive(directory: Path, out: BinaryIO) -> None:
    """Write `directory` as a deterministic tar.gz: sorted entries, zero mtimes/owners, relative names.

    Symlinks are stored as links when they resolve inside the directory; links pointing outside
    (and sockets, fifos, devices) are skipped with a warning, never followed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"put_dir: {directory} is not a directory")
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz, tarfile.open(
        fileobj=gz, mode="w", format=tarfile.PAX_FORMAT
    ) as tar:
        for name, entry in _walk(directory):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            st = entry.stat(follow_symlinks=False)
            info.mode = st.st_mode & 0o777
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if os.path.isabs(target) or not _inside(directory, os.path.join(os.path.dirname(entry.path), target)):
                    log.warning("put_dir: skipping symlink %s -> %s (points outside %s)", name, target, directory)
                    continue
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            elif entry.is_dir(follow_symlinks=False):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.is_file(follow_symlinks=False):
                info.size = st.st_size
                with open(entry.path, "rb") as f:
                    tar.addfile(info, f)
            else:
                log.warning("put_dir: skipping %s (not a file, directory or symlink)", name)


def _check_member(member: tarfile.TarInfo, target: Path) -> None:
    name = member.name
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise UnsafeArchive(f"archive member {name!r} escapes the target directory")
    if not _inside(target, os.path.join(target, name)):  # e.g. through a symlink already in the target
        raise UnsafeArchive(f"archive member {name!r} escapes the target directory through a link")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"archive member {name!r} is not a file, directory or link")
    if member.issym():
        link = member.linkname
        if os.path.isabs(link) or not _inside(target, os.path.join(target, os.path.dirname(name), link)):
            raise UnsafeArchive(f"archive symlink {name!r} -> {link!r} points outside the target directory")
    if member.islnk() and (os.path.isabs(member.linkname) or ".." in Path(member.linkname).parts):
        raise UnsafeArchive(f"archive hard link {name!r} -> {member.linkname!r} escapes the target directory")


def extract_dir_archive(archive: BinaryIO, directory: Path) -> None:
    """Extract a put_dir archive into `directory`; every member is checked before anything is written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive, mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, directory)
        tar.extractall(directory, members=members, filter="data")  # stdlib checks too, belt and braces

