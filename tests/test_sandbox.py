"""The local sandbox under attack: secrets, path escapes, outside writes, network, fork bomb, memory, CPU, files;
and the project interpreter inside it: its packages usable, read-only, nothing else of its home visible."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from mass_jobs.config.run_spec import EpisodeLimits
from mass_jobs.sandbox import run as sandbox
from mass_jobs.sandbox.run import (
    SandboxEscape,
    SandboxLimits,
    SandboxResult,
    project_interpreter,
    resolve_in_workspace,
    run_sandboxed,
)

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
    assert env["TMPDIR"] == "/tmp"  # a private tmpfs of the call, not the host's /tmp
    assert not (ws / ".tmp").exists()


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
    assert codes[1] != "0"  # beside the workspace: read-only; /tmp: the call's own tmpfs
    assert not outside.exists() and not beside.exists()
    assert (ws / "inside.txt").read_text() == "ok\n"  # the workspace itself stays writable
    assert r.applied["uid"] in range(FAST.uid_base, FAST.uid_base + FAST.uids) and "/tmp" in r.applied["private_tmpfs"]


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
    assert 0.9 < r.duration_s < 15 and time.monotonic() - t0 < 20  # killed at 1 s, far from the sleep's 30


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


# ---------------------------------------------------------------- the project's interpreter inside


def _run_as(ws: Path, cmd: str, **limits) -> SandboxResult:
    return run_sandboxed(cmd, ws, SandboxLimits(**{**asdict(FAST), **limits}))


def test_project_python_runs_with_the_hosts_numpy_and_matplotlib(ws):
    import matplotlib
    import numpy

    code = "import numpy, matplotlib, sys; print(numpy.__version__, matplotlib.__version__, sys.prefix)"
    r = run_sandboxed(f"command -v python; python -c '{code}'", ws, FAST)
    assert r.exit_code == 0, r.stderr
    where, versions = r.stdout.splitlines()
    bindir, dirs = project_interpreter()
    assert where == os.path.join(bindir, "python") and bindir == os.path.dirname(os.path.abspath(sys.executable))
    assert versions.split() == [numpy.__version__, matplotlib.__version__, sys.prefix]
    assert r.applied["uid"] in range(FAST.uid_base, FAST.uid_base + FAST.uids)
    assert r.applied["python"] == {"mode": "project", "path_first": bindir, "read_only": dirs}
    assert {d: "ro" for d in dirs}.items() <= r.applied["exposed"].items()
    assert os.path.realpath(sys.base_prefix) in dirs


def test_matplotlib_plot_is_saved_to_the_workspace(ws):
    (ws / "plot.py").write_text(
        "import os, matplotlib.pyplot as plt\n"
        "plt.plot([0, 1, 2], [0, 1, 4])\n"
        "plt.savefig('plot.png')\n"
        "print(plt.get_backend(), os.environ['MPLCONFIGDIR'])\n"
    )
    r = run_sandboxed("python plot.py", ws, FAST)
    assert r.exit_code == 0, r.stderr
    backend, config_dir = r.stdout.split()
    assert backend.lower() == "agg" and config_dir == "/tmp/matplotlib"
    png = (ws / "plot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert sorted(p.name for p in ws.iterdir()) == ["plot.png", "plot.py", "seed.txt"]  # font cache in /tmp


def test_home_shows_only_the_exposed_interpreter_and_hides_its_files(ws):
    home = os.path.realpath(Path.home())
    decoy = Path(home) / f"mass-sandbox-decoy-{secrets.token_hex(6)}"
    decoy.write_text("DECOY-SECRET-31337")
    decoy.chmod(0o644)  # anyone who reaches it may read it: only the mount namespace hides it
    try:
        on_host = set(os.listdir(home))
        probe = " ".join(f"'{home}/{name}'" for name in sorted(on_host))
        r = run_sandboxed(
            f"ls -A {home}; echo ---; cat {decoy}; echo rc=$?; "
            f'for f in {probe}; do [ -e "$f" ] && echo "visible:$f"; done; true',
            ws,
            FAST,
        )
    finally:
        decoy.unlink()
    assert r.exit_code == 0, r.stderr
    listing, rest = r.stdout.split("---\n")
    # What stays: the first step towards each exposed dir inside the home, nothing else.
    exposed = {os.path.relpath(p, home).split("/")[0] for p in r.applied["exposed"] if p.startswith(home + "/")}
    assert set(listing.split()) == exposed
    assert decoy.name in on_host and on_host > exposed
    assert "DECOY-SECRET-31337" not in r.stdout + r.stderr and "rc=1" in rest
    assert sorted(line.removeprefix("visible:") for line in rest.splitlines()[1:]) == [
        f"{home}/{name}" for name in sorted(exposed)
    ]
    assert r.applied["backend"] == "bwrap"


def test_interpreter_dirs_are_read_only_even_for_root(ws):
    _, dirs = project_interpreter()
    probes = [Path(d) / f"mass-sandbox-probe-{secrets.token_hex(6)}" for d in dirs]
    try:
        # drop_privileges off: the command runs as root, so only the read-only mount can stop it.
        r = _run_as(ws, "; ".join(f"touch {p}; echo $?" for p in probes), drop_privileges=False)
        assert [int(c) for c in r.stdout.split()] == [1] * len(dirs)
        assert r.stderr.count("Read-only file system") == len(dirs)
        assert not any(p.exists() for p in probes)
    finally:
        for p in probes:
            p.unlink(missing_ok=True)


def test_system_python_mode_keeps_the_host_path_and_exposes_nothing(ws):
    home = os.path.realpath(Path.home())
    r = _run_as(ws, f"command -v python3; ls -A {home} | wc -l", python="system")
    assert r.exit_code == 0, r.stderr
    where, home_entries = r.stdout.split()
    assert not where.startswith(project_interpreter()[0] + "/") and home_entries == "0"
    assert r.applied["python"] == {"mode": "system"}
    assert "ro" not in r.applied["exposed"].values()
    with pytest.raises(ValueError, match="SandboxLimits.python"):
        SandboxLimits(python="conda")


USERNS_DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed
r = run_sandboxed(sys.argv[3], sys.argv[2], SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=512, processes=16))
print(json.dumps(r.to_dict()))
"""


def test_user_namespace_path_exposes_its_venv_read_only_and_hides_its_home():
    """Not root: the command keeps the caller's uid, so only the mounts keep it out of the home
    and the venv. As root, the caller is played by nobody."""
    import json
    import shutil
    import subprocess

    root = Path(f"/tmp/mass-sandbox-userns-{secrets.token_hex(6)}")
    home, ws = root / "home", root / "ws"
    as_root = os.geteuid() == 0
    try:
        root.mkdir(mode=0o755)
        home.mkdir(mode=0o700)
        ws.mkdir()
        # the package, readable by nobody, wherever the checkout lies (a 0700 home's checkout is not)
        shutil.copytree(
            Path(sandbox.__file__).parents[1], root / "mass_jobs", ignore=shutil.ignore_patterns("__pycache__")
        )
        (home / "decoy").write_text("DECOY-USERNS-4242")
        base = "/usr/bin/python3" if as_root else sys.executable  # nobody cannot enter a private home
        subprocess.run([base, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_root else []
        if as_root:
            for p in [home, ws, *home.rglob("*")]:
                os.lchown(p, 65534, 65534)
        cmd = (
            f"command -v python; python -c 'import sys; print(sys.prefix)'; cat {home}/decoy; echo rc=$?; "
            f"touch {home}/venv/x; echo rc=$?; echo ok > out.txt"
        )
        proc = subprocess.run(
            [*prefix, str(home / "venv" / "bin" / "python"), "-c", USERNS_DRIVER, str(root), str(ws), cmd],
            env={"PATH": os.environ["PATH"], "HOME": str(home)},
            cwd=root,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = json.loads(proc.stdout)
        where, prefix_inside, cat_rc, touch_rc = r["stdout"].split()
        assert (where, prefix_inside) == (f"{home}/venv/bin/python", f"{home}/venv")
        assert cat_rc == "rc=1" and "DECOY-USERNS-4242" not in r["stdout"] + r["stderr"]
        assert touch_rc == "rc=1" and "Read-only file system" in r["stderr"]
        assert not (home / "venv" / "x").exists() and (ws / "out.txt").read_text() == "ok\n"
        assert r["applied"]["user_namespace"] is True and r["network_isolated"] is True
        assert r["applied"]["uid"] == (65534 if as_root else os.getuid())
        assert r["applied"]["exposed"][f"{home}/venv"] == "ro"
        assert "ran as the caller's uid" in r["note"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_without_bwrap_nothing_runs_and_the_refusal_names_bubblewrap(ws, monkeypatch, tmp_path):
    """Fail closed: where bwrap cannot build the sandbox and no outer boundary was declared, a command
    that would write outside its workspace never starts."""
    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap (bubblewrap) is not installed"))
    monkeypatch.delenv(sandbox.BOUNDARY_ENV, raising=False)
    outside = tmp_path / "outside.txt"
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        run_sandboxed(f"echo forged > {outside}", ws, FAST)
    assert not outside.exists()
    assert "bubblewrap" in str(err.value) and "apt-get install bubblewrap" in str(err.value)
    assert "execution.sandbox: none" in str(err.value)
    monkeypatch.setenv(sandbox.BOUNDARY_ENV, "anything")  # only a known boundary stands in for bwrap
    with pytest.raises(sandbox.SandboxUnavailable):
        run_sandboxed(f"echo forged > {outside}", ws, FAST)
    assert not outside.exists()


@pytest.mark.parametrize("boundary", ["pod", "none"])
def test_without_bwrap_a_declared_boundary_still_gets_the_limits_and_says_what_is_missing(monkeypatch, boundary):
    """An agent pod's container (or execution.sandbox: none): the uid where it can run the interpreter,
    rlimits and tree limits hold, the note and `applied` say the filesystem and network are the host's."""
    import tempfile

    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap is not installed"))
    monkeypatch.setenv(sandbox.BOUNDARY_ENV, boundary)  # undone after the test
    ws = Path(tempfile.mkdtemp(prefix="mass-sandbox-test-", dir="/tmp"))  # /tmp: enterable by anyone
    try:
        r = run_sandboxed("id -u; echo $TMPDIR; touch $TMPDIR/t && echo tmp-ok; echo x > inside.txt", ws, FAST)
        assert r.exit_code == 0, r.stderr
        uid, tmpdir, tmp_ok = r.stdout.split()
        assert tmp_ok == "tmp-ok" and (ws / "inside.txt").exists()
        assert int(uid) == r.applied["uid"]
        if os.geteuid() == 0 and sandbox._open_to_others(sys.executable):
            assert r.applied["uid"] in range(FAST.uid_base, FAST.uid_base + FAST.uids)
        assert not Path(tmpdir).exists()  # the call's host temp dir went with it
        assert r.applied["backend"] == "none" and r.applied["boundary"] == boundary and r.network_isolated is False
        assert "no sandbox namespaces (bwrap is not installed)" in r.note
        assert sandbox.OUTER_BOUNDARIES[boundary] in r.note
        burn = "python3 -c 'import time; t=time.process_time()\nwhile time.process_time()-t<0.8: pass'"
        chain = run_sandboxed(
            f"for i in 1 2 3 4 5 6; do {burn}; done", ws, SandboxLimits(timeout_s=60, cpu_s=1, processes=16)
        )
        assert chain.killed_reason == "cpu_limit"  # each under 1 s, the tree over it
    finally:
        shutil.rmtree(ws)


@pytest.mark.skipif(os.geteuid() != 0, reason="a leased uid is a root caller's")
def test_without_bwrap_as_root_a_workspace_no_leased_uid_can_reach_runs_as_the_caller(ws, monkeypatch):
    """The leased uid cannot enter pytest's 0700 folders: rather than fail every command (126), the
    command runs as the caller, and the note says why."""
    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap is not installed"))
    monkeypatch.setenv(sandbox.BOUNDARY_ENV, "none")
    r = run_sandboxed("id -u", ws, FAST)
    assert r.exit_code == 0 and r.stdout.strip() == "0", r.stderr
    assert "no other uid can reach the interpreter or the workspace" in r.note
