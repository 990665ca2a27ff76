"""Memory the supervisor's samples miss, held by the kernel: each sandboxed call runs in a memory
cgroup of its own (mass_jobs/sandbox/memory_cgroup.py), so a balloon faster than the sampling interval,
memory no process maps (memfds) and descriptors past RLIMIT_NOFILE all stop at the call's limit.
The host loses at most the limit plus 10% (the cgroup's own peak); the call says what held it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mass_jobs.sandbox.memory_cgroup import reason_unavailable
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed

LIMITS = SandboxLimits(timeout_s=60, cpu_s=30, memory_mb=128, processes=16, limit_address_space=False)


@pytest.fixture
def ws(tmp_path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    return w


def _held(r, limits=LIMITS) -> None:
    assert r.memory_limit in ("cgroup v1", "cgroup v2"), (r.memory_limit, r.note, reason_unavailable())
    assert r.killed_reason == "memory_limit", (r.killed_reason, r.stdout[-300:], r.stderr[-300:])
    assert r.applied["usage"]["max_memory_mb"] <= limits.memory_mb * 1.1, r.applied["usage"]


def test_a_balloon_faster_than_the_samples(ws):
    """1 GB touched in well under the 0.2 s sampling interval: RLIMIT_AS off (as for node)."""
    r = run_sandboxed(
        'python -c \'b = bytearray(1 << 30); b[::4096] = b"x" * len(b[::4096]); print("alive")\'', ws, LIMITS
    )
    _held(r)
    assert "alive" not in r.stdout


def test_unmapped_memfds(ws):
    """Three 100 MB memfds written and never mapped: no process's RSS holds them."""
    script = (
        "import os\nfds = []\nfor i in range(3):\n    fd = os.memfd_create(f'm{i}')\n"
        "    for _ in range(100):\n        os.write(fd, b'x' * (1 << 20))\n    fds.append(fd)\nprint('alive')\n"
    )
    (ws / "m.py").write_text(script)
    r = run_sandboxed("python m.py", ws, LIMITS)
    _held(r)
    assert "alive" not in r.stdout


def test_descriptors_stop_at_rlimit_nofile(ws):
    """1,200 filled socket pairs asked for: the descriptor limit stops them long before."""
    limits = replace(LIMITS, open_files=256)
    script = (
        "import socket\nn = 0\ntry:\n    for _ in range(1200):\n        a, b = socket.socketpair()\n"
        "        a.setblocking(False)\n        try:\n            while True:\n                a.send(b'x' * 65536)\n"
        "        except BlockingIOError:\n            pass\n        globals()[f'p{n}'] = (a, b)\n        n += 1\n"
        "except OSError as e:\n    print('stopped', n, e.errno)\n"
    )
    (ws / "s.py").write_text(script)
    r = run_sandboxed("python s.py", ws, limits)
    assert r.memory_limit in ("cgroup v1", "cgroup v2")
    if r.killed_reason is None:  # the descriptors ran out first: EMFILE (24) under 256
        words = r.stdout.split()
        assert words[0] == "stopped" and int(words[1]) < 128 and words[2] == "24", r.stdout
    else:  # or their buffers reached the memory limit first
        _held(r, limits)
    assert r.applied["rlimits"]["RLIMIT_NOFILE"] == 256
    assert r.applied["usage"]["max_memory_mb"] <= limits.memory_mb * 1.1


def test_an_episode_status_says_what_held_memory(ws):
    from mass_jobs.config.run_spec import EpisodeLimits
    from mass_jobs.episodes import tools as T

    out = T.shell(ws, {"command": "echo hi"}, EpisodeLimits(), 30)
    assert out.ok and out.memory_limit in ("cgroup v1", "cgroup v2")
