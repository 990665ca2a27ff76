"""The supervisor's view of one sandboxed call's process tree: which processes it holds, their CPU
and memory (PSS), the workspace's size, the capped output readers, and the limits that end the
tree (`mass_jobs.sandbox.run` runs the call; `limits` is its SandboxLimits)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from mass_jobs.sandbox.memory_cgroup import MemoryCgroup

SAMPLE_S = 0.2  # how often the supervisor samples the tree (and, every 5th time, the workspace)


def tree_pids(root: int) -> list[int]:
    """`root` and every live descendant (orphans in the PID namespace hang under its init)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_usage(root: int) -> tuple[float, float, int]:
    """(CPU seconds, memory MB as PSS, processes) of the tree under `root`, reaped children included."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = mem = 0.0
    pids = tree_pids(root)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            cpu += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        mem += int(line.split()[1]) / 1024
                        break
        except (OSError, IndexError, ValueError):
            continue
    return cpu, mem, len(pids)


def workspace_usage(root: Path) -> tuple[int, int]:
    """(apparent bytes, entries) under `root`, links not followed, hard links once. coreutils' du
    walks with fts, so nothing hides past PATH_MAX or a deep recursion."""
    import subprocess

    def du(*flags: str) -> int:
        out = subprocess.run(["du", "-s", *flags, "--", str(root)], capture_output=True, text=True)
        return int(out.stdout.split()[0]) if out.stdout.split() else 0

    return du("-b"), du("--inodes") - 1  # the root itself is not an entry


FLOOD_FACTOR, FLOOD_MIN = 64, 64 << 20  # output past max(64 x cap, 64 MiB) ends the call (output_limit)


def read_capped(stream: Any, cap: int, sink: dict) -> None:
    buf = bytearray()
    dropped = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        room = cap - len(buf)
        buf += chunk[: max(room, 0)]
        dropped += max(len(chunk) - max(room, 0), 0)
        sink["data"], sink["dropped"] = bytes(buf), dropped
        if dropped > max(FLOOD_FACTOR * cap, FLOOD_MIN):  # an endless stream: stop paying for it
            sink["flood"] = True
            break
    sink["data"], sink["dropped"] = bytes(buf), dropped


def over_quota(workspace: Path, limits: Any, scratch: Path | None = None) -> tuple[str, str] | None:
    """(reason, what is over) when the workspace, or a /tmp kept on disk (`scratch`), holds more than
    its quota, else None."""
    size, files = workspace_usage(workspace)
    if files > limits.workspace_files:
        return "workspace_quota", f"workspace holds over {limits.workspace_files} entries"
    if size > limits.workspace_mb * 1024 * 1024:
        return "workspace_quota", f"workspace holds {size} bytes, over its {limits.workspace_mb} MB quota"
    if scratch is not None and (size := workspace_usage(scratch)[0]) > limits.tmp_mb * 1024 * 1024:
        return "scratch_quota", f"/tmp holds {size} bytes, over its {limits.tmp_mb} MB quota"
    return None


def memory_cgroup(limits: Any, notes: list[str]):
    """The call's memory cgroup (the kernel holds the whole tree to memory_mb), or None: then only
    the supervisor's samples and RLIMIT_AS hold it, and a note says so."""

    try:
        cgroup = MemoryCgroup.create("sandbox", limits.memory_mb * 1024 * 1024)
    except OSError as exc:
        notes.append(f"memory held by sampling only: no memory cgroup can be made ({exc.strerror or exc})")
        return None
    if cgroup is None:
        notes.append("memory held by sampling only: no cgroup memory controller is mounted")
    return cgroup


def supervise(
    proc: Any,
    workspace: Path,
    limits: Any,
    t0: float,
    sinks: dict,
    stop: threading.Event | None = None,
    cgroup=None,
    scratch: Path | None = None,
) -> tuple:
    """Wait for the call, sampling its tree; kill it on the wall, CPU, memory, workspace, scratch or
    output limit. Returns (reason or None, peak usage, what was over)."""
    import subprocess

    peak = {"cpu": 0.0, "mem": 0.0}
    n = 0
    while True:
        try:
            proc.wait(timeout=SAMPLE_S)
            return None, peak, ""
        except subprocess.TimeoutExpired:
            pass
        n += 1
        cpu, mem, _ = tree_usage(proc.pid)
        peak["cpu"], peak["mem"] = max(peak["cpu"], cpu), max(peak["mem"], mem)
        reason, why = None, ""
        if stop is not None and stop.is_set():
            reason, why = "stopped", "stopped by the caller"
        elif time.monotonic() - t0 >= limits.timeout_s:
            reason = "wall_timeout"
        elif cpu > limits.cpu_s + 1:  # a tree of processes each under RLIMIT_CPU
            reason, why = "cpu_limit", f"tree used {cpu:.1f} CPU s, over {limits.cpu_s}"
        elif cgroup is not None and cgroup.oom_kills():  # the kernel ended one process: end the tree
            reason, why = (
                "memory_limit",
                f"the kernel's OOM killer ended the tree at its {limits.memory_mb} MB cgroup limit",
            )
        elif mem > limits.memory_mb:
            reason, why = "memory_limit", f"tree held {mem:.0f} MB, over {limits.memory_mb} MB"
        elif any(s.get("flood") for s in sinks.values()):
            reason, why = (
                "output_limit",
                f"output flood: over {max(FLOOD_FACTOR * limits.output_bytes, FLOOD_MIN)} bytes",
            )
        elif n % 5 == 0 and (quota := over_quota(workspace, limits, scratch)):
            reason, why = quota
        if reason:
            kill_tree(proc.pid)
            proc.wait()
            return reason, peak, why


def kill_tree(pid: int) -> None:
    """SIGKILL the launcher's group and every descendant (bwrap's PID namespace dies with its init)."""
    for p in reversed(tree_pids(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def signal_reason(code: int, limits: Any, peak: dict) -> str | None:
    """Why the command died, from its exit status (a shell reports a signalled child as 128+N)."""
    sig = -code if code < 0 else (code - 128 if 128 < code < 128 + 65 else None)
    if sig is None:
        return None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and peak["cpu"] >= limits.cpu_s - 0.05):
        return "cpu_limit"
    if sig == signal.SIGXFSZ:
        return "file_size_limit"
    if sig in (signal.SIGSEGV, signal.SIGKILL, signal.SIGABRT) and peak["mem"] >= 0.9 * limits.memory_mb:
        return "memory_limit"
    try:
        return f"signal:{signal.Signals(sig).name}"
    except ValueError:
        return None
