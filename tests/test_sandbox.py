"""The local sandbox under attack: secrets, path escapes, outside writes, network, fork bomb, memory, CPU, files."""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from mass_jobs.models import EpisodeLimits
from mass_jobs.sandbox import SandboxEscape, SandboxLimits, resolve_in_workspace, run_sandboxed

FAST = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=512, file_size_mb=8, processes=16)


@pytest.fixture
def ws(tmp_path) -> Path:
    w = tmp_path / "workspace"
    w.mkdir()
    (w / "seed.txt").write_text("seed\n")
    return w


def test_secret_environment_never_reaches_the_command(ws, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-123")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret-456")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-token-789")
    r = run_sandboxed("env", ws, FAST)
    assert r.exit_code == 0
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    for leaked in ("AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "GITHUB_TOKEN"):
        assert leaked not in env
    for value in ("aws-secret-value-123", "sk-openai-secret-456", "ghp-token-789"):
        assert value not in r.stdout
    assert not [k for k in env if k.startswith("AWS_") or "TOKEN" in k or k.endswith("_API_KEY")]
    assert env["HOME"] == str(ws.resolve())
    assert env["TMPDIR"].startswith(str(ws.resolve() / ".tmp"))
    assert not (ws / ".tmp").exists()  # the per-call temp dir is gone afterwards


@pytest.mark.parametrize(
    "rel", ["../outside.txt", "a/../../outside.txt", "/etc/passwd", "~/x", "", "link_dir/passwd", "link_file"]
)
def test_resolve_in_workspace_rejects_escapes(ws, rel):
    (ws / "link_dir").symlink_to("/etc")
    (ws / "link_file").symlink_to(ws.parent / "secret.txt")
    (ws.parent / "secret.txt").write_text("secret")
    with pytest.raises(SandboxEscape):
        resolve_in_workspace(ws, rel)


def test_resolve_in_workspace_accepts_inside_paths(ws):
    (ws / "sub").mkdir()
    (ws / "inner_link").symlink_to(ws / "sub")
    root = ws.resolve()
    assert resolve_in_workspace(ws, "seed.txt") == root / "seed.txt"
    assert resolve_in_workspace(ws, "sub/../seed.txt") == root / "seed.txt"
    assert resolve_in_workspace(ws, "inner_link/new/file.py") == root / "sub" / "new" / "file.py"
    assert resolve_in_workspace(ws, ".") == root


def test_writing_outside_the_workspace_fails(ws):
    outside = Path(f"/tmp/outside-{secrets.token_hex(6)}")
    beside = ws.parent / f"beside-{secrets.token_hex(6)}"
    r = run_sandboxed(f"echo x > {outside}; echo $? ; echo y > {beside}; echo $? ; echo ok > inside.txt", ws, FAST)
    codes = r.stdout.split()
    assert codes[0] != "0" and codes[1] != "0"
    assert not outside.exists() and not beside.exists()
    assert (ws / "inside.txt").read_text() == "ok\n"  # the workspace itself stays writable
    assert r.applied["uid"] == 65534 and "/tmp" in r.applied["covered_dirs"]


def test_seed_files_written_by_the_host_are_editable(ws):
    r = run_sandboxed("echo more >> seed.txt && mkdir -p out && echo 1 > out/r.txt", ws, FAST)
    assert r.exit_code == 0, r.stderr
    assert (ws / "seed.txt").read_text() == "seed\nmore\n" and (ws / "out" / "r.txt").read_text() == "1\n"


def test_network_connection_to_host_loopback_fails(ws):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as e:\n"
            "    print('blocked', e.errno)\n"
        )
        (ws / "net.py").write_text(code)
        r = run_sandboxed("python3 net.py", ws, FAST)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever reached the host's listener
    assert r.stdout.startswith("blocked"), r.stdout + r.stderr
    assert r.network_isolated is True


def test_fork_bomb_is_bounded_and_its_children_die_with_the_call(ws):
    code = (
        "import os, time\n"
        "n = 0\n"
        "for i in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print('stopped', n, e.errno); break\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "else:\n"
        "    print('unbounded', n)\n"
    )
    (ws / "bomb.py").write_text(code)
    limits = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=512, file_size_mb=8, processes=8)
    r = run_sandboxed("python3 bomb.py", ws, limits)
    word, forks, errno = r.stdout.split()
    assert word == "stopped" and int(errno) == 11  # EAGAIN from RLIMIT_NPROC
    assert 0 <= int(forks) < 8
    assert r.applied["rlimits"]["RLIMIT_NPROC"] == 8
    assert r.duration_s < 10  # the sleeping children were killed with the namespace, not waited for


def test_memory_hog_gets_memory_error(ws):
    limits = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256, file_size_mb=8, processes=16)
    r = run_sandboxed("python3 -c 'x = bytearray(1024 ** 3); print(len(x))'", ws, limits)
    assert r.exit_code == 1
    assert "MemoryError" in r.stderr and r.stdout == ""
    assert r.applied["rlimits"]["RLIMIT_AS"] == 256 * 1024 * 1024


def test_endless_sleep_is_killed_by_the_wall_timeout(ws):
    limits = SandboxLimits(timeout_s=1, cpu_s=10, memory_mb=256, file_size_mb=8, processes=16)
    t0 = time.monotonic()
    r = run_sandboxed("sleep 30", ws, limits)
    assert r.timed_out and r.killed_reason == "wall_timeout" and r.exit_code == -9
    assert 0.9 < r.duration_s < 4 and time.monotonic() - t0 < 6


def test_setsid_escapee_is_killed_with_the_call(ws):
    marker = f"{30 + secrets.randbelow(1000) / 1000:.3f}"
    limits = SandboxLimits(timeout_s=1, cpu_s=10, memory_mb=256, file_size_mb=8, processes=16)
    r = run_sandboxed(f"setsid sleep {marker} & sleep {marker}", ws, limits)
    assert r.timed_out
    time.sleep(0.3)
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.append(pid)
        except OSError:
            pass
    assert alive == []


def test_busy_loop_is_killed_by_the_cpu_limit(ws):
    limits = SandboxLimits(timeout_s=30, cpu_s=1, memory_mb=256, file_size_mb=8, processes=16)
    r = run_sandboxed("python3 -c 'while True: pass'", ws, limits)
    assert not r.timed_out
    assert r.killed_reason == "cpu_limit"
    assert r.duration_s < 10


def test_large_file_is_stopped_by_the_file_size_limit(ws):
    limits = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256, file_size_mb=1, processes=16)
    r = run_sandboxed("head -c 3000000 /dev/zero > big.bin", ws, limits)
    assert r.exit_code != 0 and r.killed_reason == "file_size_limit"
    assert (ws / "big.bin").stat().st_size == 1024 * 1024


def test_own_pid_namespace_hides_host_processes(ws):
    r = run_sandboxed("ls /proc | grep -c '^[0-9]'", ws, FAST)
    assert r.applied["pid_namespace"] is True
    assert int(r.stdout) < 6  # supervisor, shell, ls, grep: not the host's processes


def test_output_is_capped(ws):
    limits = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256, file_size_mb=8, processes=16, output_bytes=1000)
    r = run_sandboxed("head -c 300000 /dev/zero | tr '\\0' a; echo err >&2", ws, limits)
    assert len(r.stdout) == 1000 and r.truncated and r.stderr == "err\n"
    assert "299000 bytes dropped" in r.note


def test_exit_code_and_output_pass_through(ws):
    r = run_sandboxed("cat seed.txt; echo oops >&2; exit 3", ws, FAST)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (3, "seed\n", "oops\n", False, None)


def test_limits_from_episode_limits():
    lim = SandboxLimits.from_episode_limits(
        EpisodeLimits(shell_timeout_s=30, cpu_s=20, memory_mb=1024, file_size_mb=64, processes=32)
    )
    assert (lim.timeout_s, lim.cpu_s, lim.memory_mb, lim.file_size_mb, lim.processes) == (30, 20, 1024, 64, 32)
    assert lim.isolate_network and lim.drop_privileges


def test_network_isolation_switched_off_is_reported(ws):
    limits = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256, file_size_mb=8, processes=16, isolate_network=False)
    r = run_sandboxed("cat /proc/net/dev | grep -c ':'", ws, limits)
    assert r.exit_code == 0 and r.network_isolated is False
    assert "network isolation switched off" in r.note
