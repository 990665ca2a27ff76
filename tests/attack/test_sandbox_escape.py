"""Sandbox escape: from inside a sandboxed call, walk the whole filesystem view for places that
can be written or connected to. Before the walk the host plants what an attacker would look for:
a unix socket bound by a host process in /tmp, /run, a world-writable dir and beside the workspace,
an abstract unix socket, a world-writable dir of its own. Only the workspace (and the call's own
private tmpfs at /tmp and /dev/shm, which no one else sees) may be writable; no socket reachable."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed

LIMITS = SandboxLimits(timeout_s=300, cpu_s=200, memory_mb=1024, processes=32)

WALKER = r"""
import json, os, socket, stat, sys
skip = ("/proc",)
writable, sockets, fifos, devices = [], [], [], []
seen = 0
for top, dirs, files in os.walk("/", followlinks=False):
    if top.startswith(skip):
        dirs[:] = []
        continue
    if os.access(top, os.W_OK):
        probe = os.path.join(top, ".probe-%d" % os.getpid())
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY)); os.unlink(probe)
            writable.append(top)
        except OSError:
            pass
    for name in files + dirs:
        seen += 1
        p = os.path.join(top, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            try:
                s.connect(p); sockets.append([p, "connected"])
            except OSError as e:
                sockets.append([p, e.strerror])
            finally:
                s.close()
        elif stat.S_ISFIFO(st.st_mode):
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK)); fifos.append(p)
            except OSError:
                pass
        elif stat.S_ISREG(st.st_mode) and os.access(p, os.W_OK):
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_APPEND)); writable.append(p)
            except OSError:
                pass
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            devices.append(p)
abstract = []
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0" + name); abstract.append([name, "connected"])
    except OSError as e:
        abstract.append([name, e.strerror])
print(json.dumps({"seen": seen, "writable": writable, "sockets": sockets, "fifos": fifos, "devices": devices, "abstract": abstract}))
"""


def _listen(path_or_name: str, abstract: bool = False) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0" + path_or_name if abstract else path_or_name)
    if not abstract:
        os.chmod(path_or_name, 0o777)  # anyone who can reach it may connect
    s.listen(8)
    s.settimeout(0.2)
    return s


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Host sockets and world-writable dirs where an attacker would look; all removed afterwards."""
    tag = secrets.token_hex(4)
    tmp_path = tmp_path_factory.mktemp("escape")
    ws = tmp_path / "ws"
    ws.mkdir()
    open_dirs = [Path(f"/var/tmp/mass-attack-{tag}"), Path(f"/srv/mass-attack-{tag}"), tmp_path / f"open-{tag}"]
    for d in open_dirs:
        d.mkdir(parents=True)
        d.chmod(0o1777)
    paths = [f"/tmp/mass-attack-{tag}.sock", str(open_dirs[0] / "s.sock"), str(tmp_path / f"beside-{tag}.sock")]
    if os.path.isdir("/run"):
        paths.append(f"/run/mass-attack-{tag}.sock")
    listeners = [_listen(p) for p in paths] + [_listen(f"mass-attack-{tag}", abstract=True)]
    yield {"ws": ws, "sockets": paths, "abstract": [f"mass-attack-{tag}"], "open_dirs": [str(d) for d in open_dirs]}
    for s in listeners:
        s.close()
    for p in paths:
        Path(p).unlink(missing_ok=True)
    for d in open_dirs:
        shutil.rmtree(d, ignore_errors=True)


_walks: dict[bool, tuple[dict, object]] = {}


def walk(planted, limits: SandboxLimits) -> tuple[dict, object]:
    """The walker's findings (one walk per limits: it reads every file of the view)."""
    if limits.drop_privileges not in _walks:
        (planted["ws"] / "walk.py").write_text(WALKER)
        r = run_sandboxed(f"python walk.py {' '.join(planted['abstract'])}", planted["ws"], limits)
        assert r.exit_code == 0, r.stderr[-2000:]
        _walks[limits.drop_privileges] = json.loads(r.stdout), r
    return _walks[limits.drop_privileges]


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def test_walk_finds_only_the_workspace_and_private_tmpfs_writable(planted):
    found, r = walk(planted, LIMITS)
    ws = str(planted["ws"].resolve())
    assert ws in found["writable"] and found["seen"] > 1000  # it did walk the system dirs
    outside = [p for p in found["writable"] if not _inside(p, [ws, "/tmp", "/dev/shm"])]
    assert outside == []
    assert not any(_inside(p, planted["open_dirs"]) for p in found["writable"])
    assert r.applied["backend"] == "bwrap"


def test_walk_reaches_no_host_socket(planted):
    found, _ = walk(planted, LIMITS)
    assert [s for s in found["sockets"] if s[1] == "connected"] == []
    seen = {p for p, _ in found["sockets"]}
    assert not seen & set(planted["sockets"])  # the host's sockets are not even in the view
    assert found["abstract"] == [[planted["abstract"][0], "Connection refused"]]  # another network namespace


def test_walk_as_root_without_capabilities_writes_nothing_outside(planted):
    found, r = walk(planted, replace(LIMITS, drop_privileges=False))
    ws = str(planted["ws"].resolve())
    assert [p for p in found["writable"] if not _inside(p, [ws, "/tmp", "/dev/shm"])] == []
    assert [s for s in found["sockets"] if s[1] == "connected"] == [] and found["fifos"] == []


def test_only_harmless_devices_are_visible(planted):
    found, _ = walk(planted, LIMITS)
    harmless = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts/ptmx"}
    assert set(found["devices"]) <= harmless


def test_private_tmp_and_shm_are_not_the_hosts(planted):
    mark = f"mass-attack-{secrets.token_hex(4)}"
    r = run_sandboxed(f"echo x > /tmp/{mark} && echo x > /dev/shm/{mark} && ls /tmp /dev/shm", planted["ws"], LIMITS)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split().count(mark) == 2
    assert not Path(f"/tmp/{mark}").exists() and not Path(f"/dev/shm/{mark}").exists()
    again = run_sandboxed(f"ls /tmp/{mark}", planted["ws"], LIMITS)  # the next call starts empty
    assert again.exit_code != 0


def test_a_new_user_namespace_cannot_remount_the_view_writable(planted):
    cmd = (
        "unshare --user --map-root-user --mount sh -c "
        "'mount -o remount,rw,bind /usr; mount -t tmpfs none /etc; touch /usr/mass-attack; echo inner=$?'; "
        "ls /usr/mass-attack; echo outer=$?"
    )
    r = run_sandboxed(cmd, planted["ws"], LIMITS)
    assert not Path("/usr/mass-attack").exists()
    assert "inner=0" not in r.stdout and "outer=0" not in r.stdout


def test_hard_link_to_a_host_file_is_refused(planted):
    r = run_sandboxed("ln /etc/hostname stolen; echo rc=$?; ln /usr/bin/env env2; echo rc=$?", planted["ws"], LIMITS)
    assert r.stdout.split() == ["rc=1", "rc=1"]
    assert not (planted["ws"] / "stolen").exists() and not (planted["ws"] / "env2").exists()


def test_host_processes_cannot_be_seen_or_signalled(planted):
    r = run_sandboxed(f"kill -0 {os.getpid()}; echo rc=$?; ls /proc | grep -c '^[0-9]'", planted["ws"], LIMITS)
    rc, count = r.stdout.split()
    assert rc == "rc=1" and int(count) < 8


def test_setuid_binaries_do_not_regain_root(planted):
    r = run_sandboxed(
        "su -c id root </dev/null; mount -t tmpfs none /tmp; id -u; grep CapEff /proc/self/status",
        planted["ws"],
        LIMITS,
    )
    uid, _, cap = r.stdout.split()[-3:]
    assert int(uid) == r.applied["uid"] != 0 and cap == "0000000000000000"


def test_concurrent_calls_neither_see_nor_share_uids(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    out: dict[str, object] = {}

    def call(name, ws):
        cmd = "touch started; while [ ! -e go ]; do sleep 0.05; done; ls /proc | grep -c '^[0-9]'; id -u"
        out[name] = run_sandboxed(cmd, ws, replace(LIMITS, timeout_s=120))

    threads = [threading.Thread(target=call, args=(n, w)) for n, w in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    while not ((a / "started").exists() and (b / "started").exists()):  # both run at once
        assert all(t.is_alive() for t in threads)
        threading.Event().wait(0.05)
    (a / "go").touch()
    (b / "go").touch()
    for t in threads:
        t.join()
    ra, rb = out["a"], out["b"]
    assert ra.exit_code == 0 and rb.exit_code == 0, (ra.stderr, rb.stderr)
    assert ra.applied["uid"] != rb.applied["uid"]
    for r in (ra, rb):
        procs, uid = r.stdout.split()
        assert int(uid) == r.applied["uid"] and int(procs) < 6  # the other call's processes are not there
    assert a.stat().st_uid == ra.applied["uid"] and b.stat().st_uid == rb.applied["uid"]


@pytest.mark.parametrize("drop", [True, False])
def test_kernel_settings_and_sysrq_are_out_of_reach(planted, drop):
    """/proc is the call's own, but /proc/sys and sysrq-trigger act on the whole host: read-only
    there, also for a command left as root (no capabilities)."""
    targets = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
        "/proc/sysrq-trigger",
        "/proc/sys/fs/file-max",
    ]
    # access(W_OK) only: a probe that writes would change the host when it breaks.
    cmd = (
        "; ".join(f"test -w {t}; echo rc=$?" for t in targets)
        + "; python -c \"import os; print(os.access('/proc/sys/kernel/core_pattern', os.W_OK))\""
    )
    r = run_sandboxed(cmd, planted["ws"], replace(LIMITS, drop_privileges=drop))
    assert r.stdout.split() == ["rc=1"] * len(targets) + ["False"], r.stderr


def test_a_private_workspace_is_entered_as_its_uid(tmp_path):
    ws = tmp_path / "private"
    ws.mkdir(mode=0o700)
    r = run_sandboxed("pwd; echo x > f && echo wrote", ws, LIMITS)
    assert r.exit_code == 0 and r.stdout.split() == [str(ws.resolve()), "wrote"], r.stderr


def test_a_workspace_name_full_of_shell_syntax_is_just_a_name(tmp_path):
    ws = tmp_path / "a b'$(touch pwned)`touch pwned2`;\"x"
    ws.mkdir()
    r = run_sandboxed("pwd", ws, LIMITS)
    assert r.exit_code == 0 and r.stdout == f"{ws.resolve()}\n", r.stderr
    assert sorted(p.name for p in tmp_path.rglob("pwned*")) == []
