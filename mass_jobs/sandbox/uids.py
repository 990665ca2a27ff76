"""Sandbox uids as root: one per workspace in use, leased across processes with a lock file, with
the passwd and group entries the call sees for it, and the workspace handed to it (`limits` is a sandbox.SandboxLimits)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any


def own_tree(root: Path, uid: int, gid: int) -> None:
    """Hand the workspace to the call's uid so the command can write there (and only there).

    coreutils' chown walks with fts: a tree deeper than PATH_MAX or Python's recursion limit
    (which a command can make) is handled; links are changed themselves, never followed.
    """
    import subprocess

    subprocess.run(["chown", "-R", "-h", "-P", f"{uid}:{gid}", "--", str(root)], check=True, capture_output=True)


_leases: dict[str, list] = {}  # workspace -> [uid, users, lock fd]


def identity_files(uid: int) -> list[Path]:
    """passwd and group of this host plus a `sandbox` entry for `uid`, shown over /etc in its view."""
    out = []
    for name, line in (("passwd", f"sandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/sh\n"), ("group", f"sandbox:x:{uid}:\n")):
        path = lease_dir() / f"{name}-{uid}"
        if not path.exists():
            host = Path(f"/etc/{name}").read_text() if Path(f"/etc/{name}").exists() else ""
            tmp = path.with_suffix(f".{os.getpid()}")
            tmp.write_text(host + ("" if host.endswith("\n") or not host else "\n") + line)
            tmp.chmod(0o644)
            os.replace(tmp, path)
        out.append(path)
    return out


def lease_dir() -> Path:
    """One fixed place per host (not $TMPDIR, which callers may vary), owned by us alone."""
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    d = base / "mass-sandbox-uids"
    d.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{d} is not a private directory of uid {os.geteuid()}: refusing to lease sandbox uids there"
        )
    return d


def lease_uid(workspace: str, limits: Any) -> int:
    """A uid no other workspace uses now, in this process or another (flock, released on death)."""
    import fcntl

    with _lease_lock:
        if workspace in _leases:
            _leases[workspace][1] += 1
            return _leases[workspace][0]
        taken = {lease[0] for lease in _leases.values()}
        for uid in range(limits.uid_base, limits.uid_base + limits.uids):
            if uid in taken:
                continue
            fd = os.open(lease_dir() / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _leases[workspace] = [uid, 1, fd]
            return uid
    raise RuntimeError(f"all {limits.uids} sandbox uids from {limits.uid_base} are in use")


def release_uid(workspace: str) -> None:
    with _lease_lock:
        lease = _leases[workspace]
        lease[1] -= 1
        if lease[1] == 0:
            os.close(lease[2])
            del _leases[workspace]


_lease_lock = threading.Lock()
