"""Directories as one deterministic .tar.gz (put_dir / get_dir of a Store), and a hostile-proof extractor.

Workspace archives are written by agent pods, so extraction assumes an attacker wrote them. It
never resolves paths (os.path.realpath stops following links past PATH_MAX: the CVE-2025-4517
class) and never follows a link while writing. Instead:

- names and link targets are checked as strings: relative, no `..`, bounded lengths and depth;
  a symlink may only point downward, so no chain of links can leave the tree;
- every file, directory and link is created relative to an open directory fd with O_NOFOLLOW /
  O_EXCL, so a link (or a duplicate name) in the way is a refusal, never a write through it;
- the expansion is bounded (content bytes, members, header bytes, expansion ratio), checked at
  each header before its data is read, so a 1 MB archive claiming 1 GiB costs one header;
- everything lands in a fresh sibling directory renamed onto the target only at the end: any
  refusal (`UnsafeArchive`) removes it and leaves no partial target behind.

None of this depends on the interpreter's own tarfile filters (the images pin a patched Python
anyway): the archive is read as a stream and only member headers and file data are taken from it.
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NAME_MAX = 255  # bytes of one path component (Linux, ext4, xfs)


class UnsafeArchive(ValueError):
    """A directory archive was refused: a member escapes or is too big, or it is not a tar.gz."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on what one extraction may create. The defaults fit agent workspaces."""

    max_bytes: int = 4 << 30  # file content of all members together
    max_members: int = 100_000
    max_ratio: float = 200.0  # content bytes per compressed byte, enforced past ratio_floor
    ratio_floor: int = 64 << 20
    max_header_bytes: int = 64 << 20  # tar headers (pax/GNU long names) beyond 1 KiB per member
    max_name: int = 1024  # bytes of a member name
    max_link: int = 1024  # bytes of a symlink target
    max_depth: int = 64  # components of a member name


WORKSPACE_LIMITS = ArchiveLimits()
# Checkpoints and model dirs come from our own trainer pods: weights barely compress and are large.
MODEL_LIMITS = ArchiveLimits(max_bytes=4 << 40, max_ratio=float("inf"))


def _sorted_entries(path) -> Iterator[os.DirEntry]:
    with os.scandir(path) as it:
        return iter(sorted(it, key=lambda e: e.name))


def _walk(root: Path, limits: ArchiveLimits = WORKSPACE_LIMITS) -> Iterator[tuple[str, os.DirEntry]]:
    """Entries under root in sorted pre-order, not following symlinks. Iterative, so a tree of any
    depth is walked; what extraction would refuse (too deep, too long a name) is skipped with a warning."""
    stack = [("", _sorted_entries(root))]
    while stack:
        rel, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        name = f"{rel}/{entry.name}" if rel else entry.name
        if (
            len(stack) > limits.max_depth
            or len(name.encode("utf-8", "surrogateescape")) > limits.max_name
            or len(entry.name.encode("utf-8", "surrogateescape")) > NAME_MAX
        ):
            log.warning(
                "put_dir: skipping %s... (deeper than %d levels or a name too long to extract)",
                name[:120],
                limits.max_depth,
            )
            continue
        yield name, entry
        if entry.is_dir(follow_symlinks=False):
            stack.append((name, _sorted_entries(entry.path)))


def _downward(link: str) -> bool:
    """A relative link target without `..`: wherever it sits, it resolves below its own folder."""
    return bool(link) and not link.startswith("/") and ".." not in link.split("/")


def write_dir_archive(directory: Path, out: BinaryIO) -> None:
    """Write `directory` as a deterministic tar.gz: sorted entries, zero mtimes/owners, relative names.

    Symlinks are stored only when they point downward (relative, no `..`): exactly what
    extraction accepts. Others (and sockets, fifos, devices) are skipped with a warning, never followed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"put_dir: {directory} is not a directory")
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, entry in _walk(directory):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            st = entry.stat(follow_symlinks=False)
            # what extraction applies (& 0o755): the group-write bits an agent pod's shared workspace
            # carries (or a umask) would otherwise make the same files another archive
            info.mode = st.st_mode & 0o755
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if not _downward(target):
                    log.warning(
                        "put_dir: skipping symlink %s -> %s (not a relative link below its folder)", name, target
                    )
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


# ---------------------------------------------------------------- extraction


class _Budget:
    """Counts compressed bytes read and decompressed bytes produced; refuses past the limits."""

    def __init__(self, limits: ArchiveLimits):
        self.limits = limits
        self.compressed = self.expanded = self.content = self.members = 0

    def check(self) -> None:
        lim = self.limits
        headers = self.expanded - self.content - 1024 * self.members
        if headers > lim.max_header_bytes:
            raise UnsafeArchive(f"archive headers exceed {lim.max_header_bytes} bytes (pax or long-name bomb)")
        if self.content > lim.max_bytes:
            raise UnsafeArchive(
                f"archive expands to more than {lim.max_bytes} bytes of content (declared {self.content})"
            )
        # Bytes really produced (not yet declared ones: a large member's header comes before its data).
        if self.expanded > lim.ratio_floor and self.expanded > lim.max_ratio * max(self.compressed, 1):
            raise UnsafeArchive(
                f"archive expands {self.expanded} bytes from {self.compressed} compressed "
                f"(ratio above {lim.max_ratio:g}): a decompression bomb"
            )


class _Counted:
    """A read-only stream that reports each read to the budget (compressed or expanded side)."""

    def __init__(self, raw: BinaryIO, budget: _Budget, side: str):
        self.raw, self.budget, self.side = raw, budget, side

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(CHUNK if n is None or n < 0 else min(n, CHUNK))
        setattr(self.budget, self.side, getattr(self.budget, self.side) + len(data))
        self.budget.check()
        return data


def _parts(name: str, limits: ArchiveLimits, what: str) -> list[str]:
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > limits.max_name:
        raise UnsafeArchive(f"archive {what} {name[:80]!r}... is {len(raw)} bytes long (limit {limits.max_name})")
    if "\x00" in name or name.startswith("/"):
        raise UnsafeArchive(f"archive {what} {name!r} is absolute or has a NUL byte: it escapes the target directory")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"archive {what} {name!r} has a '..' segment: it escapes the target directory")
    if len(parts) > limits.max_depth:
        raise UnsafeArchive(f"archive {what} {name[:80]!r}... is {len(parts)} levels deep (limit {limits.max_depth})")
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        raise UnsafeArchive(f"archive {what} {name[:80]!r}... has a component over {NAME_MAX} bytes")
    return parts


def _check_member(member: tarfile.TarInfo, limits: ArchiveLimits) -> list[str]:
    """The member's path components, or UnsafeArchive saying why it is refused. Strings only, no lookups."""
    name = member.name
    if not (member.isreg() or member.isdir() or member.issym()) or member.issparse():
        kind = "hard link" if member.islnk() else "device, fifo or sparse file"
        raise UnsafeArchive(f"archive member {name!r} is a {kind}: only files, directories and symlinks are extracted")
    if member.size < 0:
        raise UnsafeArchive(f"archive member {name!r} has a negative size")
    parts = _parts(name, limits, "member")
    if not parts and not member.isdir():
        raise UnsafeArchive(f"archive member {name!r} names the target directory itself")
    if member.issym():
        link = member.linkname
        if len(link.encode("utf-8", "surrogateescape")) > limits.max_link:
            raise UnsafeArchive(f"archive symlink {name!r} target is {len(link)} long (limit {limits.max_link})")
        if not _downward(link) or "\x00" in link:
            raise UnsafeArchive(
                f"archive symlink {name!r} -> {link!r} points outside the target directory "
                "(only relative targets without '..' are extracted)"
            )
        _parts(link, limits, "symlink target")
    return parts


_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(root_fd: int, parts: list[str], name: str) -> int:
    """An fd of the member's parent directory, creating missing folders; never through a link."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeArchive(f"archive member {name!r} goes through a link or a file ({part!r})") from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _place(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    parts: list[str],
    root_fd: int,
    budget: _Budget,
    dir_modes: list[tuple[list[str], int]],
) -> None:
    if not parts:  # the archive's "." entry: the target itself
        return
    parent = _open_parent(root_fd, parts[:-1], member.name)
    leaf = parts[-1]
    try:
        if member.isdir():
            try:
                os.mkdir(leaf, 0o700, dir_fd=parent)
            except FileExistsError:
                os.close(_open_parent(parent, [leaf], member.name))  # must be a real folder, not a link
            dir_modes.append((parts, (member.mode & 0o755) | 0o700))
        elif member.issym():
            try:
                os.symlink(member.linkname, leaf, dir_fd=parent)
            except FileExistsError:
                raise UnsafeArchive(f"archive member {member.name!r} appears twice") from None
        else:
            try:
                fd = os.open(
                    leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
                )
            except FileExistsError:
                raise UnsafeArchive(f"archive member {member.name!r} appears twice") from None
            with os.fdopen(fd, "wb") as out:
                src = tar.extractfile(member)
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                os.fchmod(out.fileno(), (member.mode & 0o755) | 0o600)
    finally:
        os.close(parent)


def _extract_stream(archive: BinaryIO, root: Path, limits: ArchiveLimits) -> int:
    """Extract into the (fresh, empty) folder `root`; return the number of members."""
    budget = _Budget(limits)
    try:
        start = archive.tell()
        archive.seek(0, os.SEEK_END)
        total = archive.tell() - start
        archive.seek(start)
    except (OSError, AttributeError, ValueError):
        total = None  # not seekable: the running ratio check still applies
    dir_modes: list[tuple[list[str], int]] = []
    root_fd = os.open(root, _NOFOLLOW_DIR)
    try:
        gz = gzip.GzipFile(fileobj=_Counted(archive, budget, "compressed"), mode="rb")
        with tarfile.open(fileobj=_Counted(gz, budget, "expanded"), mode="r|") as tar:
            for member in tar:
                budget.members += 1
                if budget.members > limits.max_members:
                    raise UnsafeArchive(f"archive has more than {limits.max_members} members")
                parts = _check_member(member, limits)
                if member.isreg():
                    budget.content += member.size
                    if (
                        total is not None
                        and budget.content > limits.ratio_floor
                        and budget.content > limits.max_ratio * max(total, 1)
                    ):
                        raise UnsafeArchive(
                            f"archive declares {budget.content} bytes of content in {total} compressed bytes "
                            f"(ratio above {limits.max_ratio:g}): a decompression bomb"
                        )
                    budget.check()
                _place(tar, member, parts, root_fd, budget, dir_modes)
        for parts, mode in reversed(dir_modes):  # deepest last-listed first: a 0o500 folder set last
            fd = _open_parent(root_fd, parts, "/".join(parts))
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        return budget.members
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise UnsafeArchive(f"not a readable tar.gz archive: {err}") from None
    finally:
        os.close(root_fd)


def extract_dir_archive(archive: BinaryIO, directory: Path, limits: ArchiveLimits = WORKSPACE_LIMITS) -> Path:
    """Extract a put_dir archive into `directory`, which must be missing or an empty folder.

    All or nothing: the members land in a fresh sibling folder renamed onto `directory` at the end;
    on any refusal (`UnsafeArchive`) or error, nothing is left behind, not even `directory`.
    """
    target = Path(os.path.abspath(directory))
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        raise FileExistsError(f"get_dir: {target} must be missing or an empty folder")
    created = next((p for p in reversed([target.parent, *target.parent.parents]) if not p.exists()), None)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-extract-", dir=target.parent))
    try:
        _extract_stream(archive, staging, limits)
        os.chmod(staging, target.stat().st_mode & 0o7777 if target.exists() else 0o755)
        os.rename(staging, target)  # replaces an empty folder in one step
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    return target
