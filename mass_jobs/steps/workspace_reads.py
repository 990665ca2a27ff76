"""A finished workspace read as the guard reads it, trusting nothing the agent's code could have
made: hashes of the protected paths (what a link or a special file is, not what it points at),
a metrics file as strict JSON within its size, and whether a required output is a regular file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _kind(path: Path) -> str:
    """What a workspace entry is, never following a link or opening anything but a regular file
    (a FIFO would block the reader; a link can loop or leave the workspace)."""
    import stat

    mode = path.lstat().st_mode
    if stat.S_ISREG(mode):
        return _sha(path)
    return {stat.S_IFLNK: "symlink", stat.S_IFDIR: "directory", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}.get(
        stat.S_IFMT(mode), "device"
    )


def hash_protected(workspace: Path, paths: list[str]) -> dict[str, dict[str, str]]:
    """{protected path: {entry under it: sha256, or what it is when not a regular file}}; an absent
    path maps to {} and must stay absent. Whatever the episode left there (a link to itself, a
    FIFO, a path that leaves the workspace) is recorded as such, never followed: it differs from
    what the task seeded, so the episode is vetoed, and the guard never fails on it."""
    import os

    out: dict[str, dict[str, str]] = {}
    root = Path(workspace)
    for rel in paths:
        files: dict[str, str] = {}
        target = root / rel
        try:
            if os.path.lexists(target):
                if target.is_symlink() or not target.is_dir():
                    files[rel] = _kind(target)
                else:
                    for dirpath, dirnames, filenames in os.walk(target):  # never follows links
                        for name in sorted(dirnames + filenames):
                            entry = Path(dirpath) / name
                            if name in filenames or entry.is_symlink():
                                files[entry.relative_to(root).as_posix()] = _kind(entry)
        except (OSError, RuntimeError, ValueError) as err:
            files = {rel: f"unreadable ({type(err).__name__})"}
        out[rel] = files
    return out


def lookup(doc: Any, dotted: str) -> Any:
    cur = doc
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(part)
    return cur


METRICS_FILE_BYTES = 1 << 20  # a metrics file is a few numbers; past this it is not read


class Unreadable(ValueError):
    """Episode content a guard will not take as it stands (a veto with this reason, never a crash)."""


def strict_json(text: str) -> Any:
    """JSON as a metric may be read: a key twice (the last silently won here while the evaluator
    read the first) or an integer past exact doubles is Unreadable; NaN, Infinity and 1e400 parse
    (as non-finite floats, which the bound check vetoes by name)."""

    def pairs(items):
        keys = [k for k, _ in items]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise Unreadable(f"duplicate key {dup[0]!r}")
        return dict(items)

    def integer(text):
        value = int(text)
        if abs(value) > 2**53:  # past exact doubles: 10**400 passed as a huge int, then crashed the bound check
            raise Unreadable(f"integer out of range: {text[:40]}")
        return value

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=integer)
    except (json.JSONDecodeError, RecursionError) as err:
        raise Unreadable(f"file is not JSON ({str(err)[:120]})") from None


def regular_text(path: Path, limit: int) -> str | None:
    """The text of a regular file of at most `limit` bytes; None when absent; Unreadable otherwise."""
    import os
    import stat

    if not os.path.lexists(path):
        return None
    mode = path.lstat().st_mode
    if not stat.S_ISREG(mode):
        raise Unreadable(f"not a regular file ({_kind(path)})")
    if path.lstat().st_size > limit:
        raise Unreadable(f"larger than {limit} bytes")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8 text") from None


def metrics_document(file: str, workspace: Path) -> Any:
    """A metrics file as the metric guard reads it (strictly), or None where that read vetoes or finds none."""
    try:
        text = regular_text(workspace / file, METRICS_FILE_BYTES)
        return None if text is None else strict_json(text)
    except Unreadable:
        return None


def output_issue(workspace: Path, rel: str, seeded: dict[str, str]) -> str | None:
    """Why a required output is no deliverable: missing, empty, a link or special file, or the seeded
    stub left as it was (a placeholder passed when only its existence was checked)."""
    import os
    import stat

    path = Path(workspace) / rel
    if not os.path.lexists(path):
        return f"required output missing: {rel}"
    mode = path.lstat().st_mode
    if stat.S_ISDIR(mode):
        return None if any(path.iterdir()) else f"required output is an empty directory: {rel}"
    if not stat.S_ISREG(mode):
        return f"required output is not a regular file ({_kind(path)}): {rel}"
    if path.lstat().st_size == 0:
        return f"required output is empty: {rel}"
    if rel in seeded and _sha(path) == hashlib.sha256(seeded[rel].encode()).hexdigest():
        return f"required output is the seeded stub, unchanged: {rel}"
    return None
