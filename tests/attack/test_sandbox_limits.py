"""Sandbox limits: per-call process, CPU and memory budgets that hold for the whole process tree
(not only per process), one call's fork bomb not starving a concurrent call, the workspace quota
(bytes and entries) and the size of the private tmpfs."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed

LIMITS = SandboxLimits(timeout_s=120, cpu_s=60, memory_mb=1024, file_size_mb=64, processes=16)


@pytest.fixture
def ws(tmp_path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    return w


BOMB = """
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        open('exhausted', 'w').write(str(n))
        break
    if pid == 0:
        time.sleep(300); os._exit(0)
    n += 1
while not os.path.exists('stop'):
    time.sleep(0.05)
"""


def test_a_fork_bomb_does_not_starve_a_concurrent_call(tmp_path):
    bomb_ws, other_ws = tmp_path / "bomb", tmp_path / "other"
    bomb_ws.mkdir()
    other_ws.mkdir()
    (bomb_ws / "bomb.py").write_text(BOMB)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("bomb", run_sandboxed("python bomb.py", bomb_ws, LIMITS)))
    t.start()
    while not (bomb_ws / "exhausted").exists():  # the bomb holds all of its process budget
        assert t.is_alive()
        threading.Event().wait(0.05)
    # 12 processes at once, while the bomb still holds all of its own.
    other = run_sandboxed("for i in $(seq 12); do sleep 0.2 & done; wait; echo all-forked", other_ws, LIMITS)
    (bomb_ws / "stop").touch()
    t.join()
    assert other.exit_code == 0 and other.stdout == "all-forked\n", other.stderr
    forks = int((bomb_ws / "exhausted").read_text())
    assert 0 < forks < LIMITS.processes  # bounded by its own budget
    assert out["bomb"].exit_code == 0 and out["bomb"].applied["uid"] != other.applied["uid"]


def test_cpu_limit_holds_for_a_chain_of_processes_each_under_it(ws):
    """Five children one after another, each 1.5 CPU s under a 2 s per-process limit: 7.5 s in all."""
    limits = replace(LIMITS, cpu_s=2)
    burn = "python -c 'import time; t=time.process_time()\nwhile time.process_time()-t<1.5: pass'"
    r = run_sandboxed(f"for i in 1 2 3 4 5; do {burn}; echo $i; done", ws, limits)
    assert r.killed_reason == "cpu_limit", (r.stdout, r.stderr, r.applied.get("usage"))
    assert r.exit_code == -9 and len(r.stdout.split()) < 5
    assert r.applied["usage"]["cpu_s"] <= limits.cpu_s + 2


def test_cpu_limit_holds_for_parallel_processes(ws):
    limits = replace(LIMITS, cpu_s=2)
    burn = "python -c 'while True: pass'"
    r = run_sandboxed(f"{burn} & {burn} & {burn} & {burn} & wait", ws, limits)
    assert r.killed_reason == "cpu_limit"
    assert r.applied["usage"]["cpu_s"] <= 4 * (limits.cpu_s + 1)


def test_memory_limit_holds_for_the_tree_not_only_per_process(ws):
    """Four processes of 150 MB each, under a 256 MB per-process limit, 600 MB for a 256 MB tree."""
    limits = replace(LIMITS, memory_mb=256)
    hold = "python -c 'import time; x = bytearray(150 * 2**20); time.sleep(120)'"
    r = run_sandboxed(f"{hold} & {hold} & {hold} & {hold} & wait", ws, limits)
    assert r.killed_reason == "memory_limit", (r.stderr[-500:], r.applied.get("usage"))
    assert not r.timed_out
    if r.memory_limit == "sampled":  # only the supervisor's samples saw the tree over its budget
        assert r.applied["usage"]["max_memory_mb"] > limits.memory_mb
    else:  # the kernel held it: the tree never got past its cgroup's limit
        assert r.applied["usage"]["max_memory_mb"] <= limits.memory_mb * 1.1


def test_workspace_quota_bytes(ws):
    limits = replace(LIMITS, workspace_mb=5)
    r = run_sandboxed("for i in $(seq 20); do head -c 1000000 /dev/zero > f$i; done; sleep 100", ws, limits)
    assert r.killed_reason == "workspace_quota" and not r.timed_out
    assert "over its 5 MB quota" in r.note


def test_workspace_quota_entries(ws):
    limits = replace(LIMITS, workspace_files=200)
    r = run_sandboxed("mkdir d && cd d && seq 2000 | xargs touch; sleep 100", ws, limits)
    assert r.killed_reason == "workspace_quota" and not r.timed_out
    assert "over 200 entries" in r.note


def test_quota_is_checked_even_when_the_command_ends_at_once(ws):
    limits = replace(LIMITS, workspace_mb=1)
    r = run_sandboxed("head -c 3000000 /dev/zero > big", ws, limits)
    assert r.killed_reason == "workspace_quota"


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_private_tmpfs_is_size_capped(ws, where):
    limits = replace(LIMITS, tmp_mb=4)
    r = run_sandboxed(f"head -c 20000000 /dev/zero > {where}/big; echo rc=$?; du -k {where}/big", ws, limits)
    rc, size = r.stdout.split()[0], int(r.stdout.split()[1])
    assert rc == "rc=1" and "No space left" in r.stderr and size <= 4 * 1024


def test_threads_count_against_the_process_budget(ws):
    limits = replace(LIMITS, processes=8)
    code = (
        "import threading, time\nn = 0\n"
        "try:\n    for i in range(100):\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n    pass\nprint(n)"
    )
    (ws / "t.py").write_text(code)
    r = run_sandboxed("python t.py", ws, limits)
    assert r.exit_code == 0 and int(r.stdout) < 8


def test_large_output_is_capped_and_the_call_completes(ws):
    limits = replace(LIMITS, output_bytes=10_000, timeout_s=60)
    r = run_sandboxed("yes | head -c 500000; yes | head -c 500000 >&2; echo done > done", ws, limits)
    assert len(r.stdout) == 10_000 and len(r.stderr) == 10_000 and r.truncated
    assert r.exit_code == 0 and r.killed_reason is None and (ws / "done").exists()


def test_endless_output_ends_the_call_before_its_wall_limit(ws):
    limits = replace(LIMITS, output_bytes=10_000, timeout_s=600)
    r = run_sandboxed("yes >&2", ws, limits)
    assert r.killed_reason == "output_limit" and not r.timed_out
    assert len(r.stderr) == 10_000 and r.exit_code == -9


HOLDER = """
import sys
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed
run_sandboxed("id -u > uid; while [ ! -e go ]; do sleep 0.05; done", sys.argv[1], SandboxLimits(timeout_s=120))
"""


def test_two_processes_never_lease_the_same_uid(tmp_path):
    """Separate runs on one host (two `mass episode` pods' worth) must not share a process budget."""
    import subprocess
    import sys

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(a)], cwd=Path(__file__).resolve().parents[2])
    try:
        while not (a / "uid").exists():
            assert holder.poll() is None
            threading.Event().wait(0.05)
        here = run_sandboxed("id -u", b, LIMITS)
        assert int(here.stdout) != int((a / "uid").read_text())
    finally:
        (a / "go").touch()
        holder.wait()


def test_scratch_on_disk_is_held_to_its_size_and_removed_after(ws, tmp_path, monkeypatch):
    import subprocess
    import tempfile

    host = tmp_path / "host-tmp"
    host.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host))  # where the call's /tmp folder is made
    limits = replace(LIMITS, tmp_mb=8, tmp_on_disk=True)
    # /tmp is the host folder's filesystem, not a tmpfs of its own (df names the same device)
    r = run_sandboxed(
        "head -c 6000000 /dev/zero > /tmp/a && mkdir /tmp/d && chmod 0 /tmp/d && df --output=source /tmp | tail -1",
        ws,
        limits,
    )
    host_fs = subprocess.run(["df", "--output=source", str(host)], capture_output=True, text=True).stdout.split()[-1]
    assert r.exit_code == 0 and r.killed_reason is None and r.stdout.strip() == host_fs, (r.stdout, r.stderr)
    assert r.applied["scratch"] == {"path": "/tmp", "on": "disk", "mb": 8} and "/tmp" not in r.applied["private_tmpfs"]
    r = run_sandboxed("head -c 12000000 /dev/zero > /tmp/a; sleep 100", ws, limits)
    assert r.killed_reason == "scratch_quota" and not r.timed_out and "over its 8 MB quota" in r.note
    assert list(host.iterdir()) == []  # both calls' folders gone, the unreadable one too
