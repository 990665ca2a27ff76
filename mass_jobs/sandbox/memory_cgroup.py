"""A memory limit the kernel enforces on a whole process tree: a cgroup of its own.

    cg = MemoryCgroup.create("pod-x", limit_bytes)   # None where no cgroup can be made here
    argv = cg.wrap(argv)                             # the command joins the cgroup before it execs
    ... run it ...
    cg.oom_kills(), cg.peak_bytes(); cg.remove()

cgroup v2 (`memory.max`, `memory.swap.max`, `memory.events`) where this process's cgroup can
delegate the memory controller, else v1's memory hierarchy (`memory.limit_in_bytes` and, where
swap accounting is on, `memory.memsw.limit_in_bytes`, so the limit cannot be dodged into swap).
Every process the command forks is charged, with its page cache, memfds and socket buffers: what
sampling a tree's RSS misses. Making one needs write access to the cgroup tree (root, or a
delegated subtree); `reason_unavailable()` says why not.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """Controller (or '' for v2) -> this process's cgroup path."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _v2_parent() -> Path | None:
    if not (ROOT / "cgroup.controllers").is_file():
        return None
    base = ROOT / _own_cgroups().get("", "/").lstrip("/")
    return base if "memory" in (base / "cgroup.controllers").read_text().split() else None


def _v1_parent() -> Path | None:
    path = _own_cgroups().get("memory")
    base = ROOT / "memory"
    return base / path.lstrip("/") if path is not None and (base / "memory.limit_in_bytes").exists() else None


def reason_unavailable() -> str | None:
    """None when a memory cgroup can be made here, else why not."""
    try:
        probe = MemoryCgroup.create("probe", 64 * 2**20)
    except OSError as exc:
        return f"cannot create a memory cgroup: {exc}"
    if probe is None:
        return "no cgroup memory controller is mounted for this process"
    probe.remove()
    return None


class MemoryCgroup:
    def __init__(self, path: Path, version: int, limit: int):
        self.path, self.version, self.limit = path, version, limit

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryCgroup | None:
        """A fresh cgroup under this process's own, limited to `limit_bytes` (None: no controller;
        OSError: a controller this process may not write)."""
        leaf = f"mass-{re.sub(r'[^A-Za-z0-9_.-]', '-', name)[:60]}-{uuid.uuid4().hex[:8]}"
        v2 = _v2_parent()
        if v2 is not None:
            if "memory" not in (v2 / "cgroup.subtree_control").read_text().split():
                (v2 / "cgroup.subtree_control").write_text("+memory")
            path = v2 / leaf
            path.mkdir()
            cg = cls(path, 2, limit_bytes)
            cg._write("memory.max", limit_bytes)
            if (path / "memory.swap.max").exists():
                cg._write("memory.swap.max", 0)
            if (path / "memory.oom.group").exists():  # one OOM ends the whole tree, as the kubelet sets it
                cg._write("memory.oom.group", 1)
            return cg
        v1 = _v1_parent()
        if v1 is None:
            return None
        path = v1 / leaf
        path.mkdir()
        cg = cls(path, 1, limit_bytes)
        cg._write("memory.limit_in_bytes", limit_bytes)
        if (path / "memory.memsw.limit_in_bytes").exists():
            cg._write("memory.memsw.limit_in_bytes", limit_bytes)
        return cg

    def _write(self, name: str, value) -> None:
        (self.path / name).write_text(str(value))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the cgroup: everything it becomes and
        forks is charged from its first allocation on (no window between fork and joining)."""
        procs = str(self.path / "cgroup.procs")
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def _stat(self, name: str, key: str) -> int:
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        m = re.search(rf"^{key} (\d+)$", text, re.M)
        return int(m.group(1)) if m else 0

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended in this cgroup."""
        return (
            self._stat("memory.events", "oom_kill")
            if self.version == 2
            else self._stat("memory.oom_control", "oom_kill")
        )

    def peak_bytes(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill what is left in it and remove it (a cgroup with processes cannot be removed)."""
        end = time.monotonic() + wait_s
        while True:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > end:
                    return
                time.sleep(0.05)
