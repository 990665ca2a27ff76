"""Local sandbox for the shell commands an agent writes and for guard checks.

`run_sandboxed(cmd, cwd, limits)` runs `/bin/sh -c cmd` in the workspace `cwd`, one fresh process
tree per call. The filesystem view and namespaces come from bubblewrap (`bwrap`, a Debian
package): a read-only empty root holding only /usr, /etc (and the /bin, /lib links), the project's
interpreter dirs read-only, the workspace read-write and a private size-capped tmpfs at /dev/shm
and at /tmp (or, with `tmp_on_disk`, a fresh folder of the host's temp dir held to the same size by
the supervisor), both dying with the call. Nothing else of the host exists in there: no /run, /var, /home,
no host unix socket to connect to. New PID, network (private loopback only), IPC, UTS and cgroup
namespaces; `--die-with-parent` and a PID namespace, so a killed caller takes the whole tree with it.
With `egress_socket` (execution.network) the episode's egress proxy socket is bound in at
/run/mass-egress.sock and a relay on the namespace's loopback, started first, is the command's
only way out (`HTTP(S)_PROXY`; mass_jobs/sandbox/egress.py).

As root, every concurrently used workspace gets its own uid from `SandboxLimits.uid_base ...
+uids` (leased with a lock file, so several processes on one host never share one); the command
runs as that uid with no capabilities and no_new_privs, so RLIMIT_NPROC is a budget of this
call's tree alone and one episode's fork bomb cannot starve another's. Limits:
- per process: rlimits on CPU seconds, address space, file size, process count, no core dumps;
- per tree (a supervisor thread samples every process of the tree): total CPU seconds and total
  memory (PSS), a workspace quota (bytes and files) and a /tmp kept on disk to its size; over any
  of them, the tree is killed;
- a wall-clock timeout that kills the tree;
- a scrubbed environment (an allow-list: PATH, HOME=workspace, TMPDIR=/tmp, LANG, ...).
The project's own interpreter (this process's venv and its base installation) is `python`, first on
PATH; `SandboxLimits(python="system")` keeps the host's PATH and exposes no interpreter dir.

Without bwrap (or where it cannot create namespaces) nothing runs: `run_sandboxed` raises
SandboxUnavailable naming bubblewrap and how to install it, unless this process declared an outer
boundary (`MASS_SANDBOX`, OUTER_BOUNDARIES): `pod`, an agent pod's sandbox container, whose uid,
seccomp profile and NetworkPolicy bound it (`mass sandbox-serve` declares it), or `none`, the spec's
`execution.sandbox: none` on a machine its user trusts. Then the command still gets the rlimits and
tree limits (and a leased uid where that uid can run the interpreter), `note` and
`applied["boundary"]` say that the filesystem and network stayed the host's, and
`network_isolated` is False.

`resolve_in_workspace(workspace, rel)` maps a file-tool path into the workspace or raises
`SandboxEscape` (absolute paths, `..` escapes, symlinks pointing outside).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mass_jobs.sandbox.egress_relay import FORWARDER, SANDBOX_PORT, SANDBOX_SOCKET, sandbox_proxy_env
from mass_jobs.sandbox.tree import kill_tree, memory_cgroup, over_quota, read_capped, signal_reason, supervise
from mass_jobs.sandbox.uids import identity_files, lease_uid, own_tree, release_uid

if TYPE_CHECKING:
    from mass_jobs.config.run_spec import EpisodeLimits

LAUNCHER = Path(__file__).with_name("launch.py")  # stdlib only: run with -I -S
# mass_policy (the policy host), on PYTHONPATH and read-only for every sandboxed project interpreter
POLICY_SITE = Path(__file__).resolve().with_name("policy_site")

ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the sandbox sees of the host besides the workspace and the interpreter: read-only binds, or
# the same symlink where the host has one (merged /usr).
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PYTHON_MODES = ("project", "system")


class SandboxEscape(ValueError):
    """A path that would leave the workspace."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot build the sandbox here and no outer boundary was declared: nothing model-written runs."""


# What may stand in for bubblewrap's namespaces, declared by the process through MASS_SANDBOX (and so
# inherited by the episodes and checks it starts); anything else is refused.
BOUNDARY_ENV = "MASS_SANDBOX"
OUTER_BOUNDARIES = {
    "pod": "an agent pod's container (a uid of its own, no capabilities, seccomp RuntimeDefault, the NetworkPolicy)",
    "none": "execution.sandbox: none (a machine its user trusts: the host's filesystem and network)",
}
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
    "`make setup` does it as root), or set execution.sandbox: none on a machine you trust"
)


def outer_boundary() -> str | None:
    """The outer boundary this process declared (OUTER_BOUNDARIES), or None."""
    value = os.environ.get(BOUNDARY_ENV)
    return value if value in OUTER_BOUNDARIES else None


def declare_outer_boundary(kind: str | None) -> None:
    """Declare (or with None withdraw) what bounds model-written code here where bwrap cannot."""
    if kind is None:
        os.environ.pop(BOUNDARY_ENV, None)
        return
    if kind not in OUTER_BOUNDARIES:
        raise ValueError(f"{BOUNDARY_ENV}: expected one of {sorted(OUTER_BOUNDARIES)}, got {kind!r}")
    os.environ[BOUNDARY_ENV] = kind


def bwrap_refusal() -> str | None:
    """None where bubblewrap builds the sandbox here; else one line saying why not and what to install."""
    bwrap, why = _tools()
    if bwrap is not None:
        return None
    return f"bubblewrap cannot build the sandbox here ({why}): model-written code does not run; {INSTALL_HINT}"


def sandbox_refusal() -> str | None:
    """None where model-written code may run in this process (bwrap, or a declared outer boundary)."""
    return None if outer_boundary() is not None else bwrap_refusal()


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120
    cpu_s: int = 120  # per process (RLIMIT_CPU) and for the whole tree
    memory_mb: int = 2048  # per process (RLIMIT_AS) and for the whole tree (PSS)
    file_size_mb: int = 256
    processes: int = 64  # RLIMIT_NPROC of the call's own uid
    open_files: int = 1024  # RLIMIT_NOFILE per process: descriptors (socket pairs, memfds) are kernel memory too
    workspace_mb: int = 4096  # workspace quota, bytes (apparent size of all files)
    workspace_files: int = 100_000  # workspace quota, entries
    tmp_mb: int = 256  # size of /tmp (and of /dev/shm while /tmp is in memory)
    tmp_on_disk: bool = False  # /tmp: a folder of the host's temp dir, not a tmpfs (multi-GB caches stay off RAM)
    isolate_network: bool = True
    drop_privileges: bool = True  # as root: run the command as a leased uid of its own
    uid_base: int = 1_900_000  # leased uids: uid_base .. uid_base + uids - 1 (gid = uid)
    uids: int = 1000
    output_bytes: int = 1_000_000  # per stream; the rest is counted and dropped
    extra_env: dict[str, str] = field(default_factory=dict)
    python: str = "project"  # project: this process's interpreter, read-only, first on PATH; system: host PATH
    read_only: tuple[str, ...] = ()  # more host folders shown read-only (e.g. the checkout, for `mass ...`)
    writable: tuple[str, ...] = ()  # more host folders shown writable, handed to the call's uid like the workspace
    # workspace-relative paths shown read-only (a guard check's protected paths): neither the check nor
    # the agent code it runs can write there, and an interpreter's bytecode cache is simply not written
    read_only_paths: tuple[str, ...] = ()
    # RLIMIT_AS = memory_mb per process; off for runtimes that reserve address space they never use
    # (node's WebAssembly): the tree's memory (PSS) is still held to memory_mb by the supervisor.
    limit_address_space: bool = True
    # the episode's egress proxy (mass_jobs/sandbox/egress.py): its Unix socket is bound into the
    # sandbox and a relay on the sandbox's loopback is the command's only way out; None: no network
    egress_socket: str | None = None
    # the run's egress proxy on a cluster (mass_jobs/sandbox/egress_service.py), http://ID:TOKEN@HOST:PORT:
    # the pod's NetworkPolicy is the boundary there (no namespace of its own), the command gets HTTP(S)_PROXY
    egress_url: str | None = None

    def __post_init__(self) -> None:
        if self.python not in PYTHON_MODES:
            raise ValueError(f"SandboxLimits.python must be one of {PYTHON_MODES}, got {self.python!r}")

    @classmethod
    def from_episode_limits(cls, limits: EpisodeLimits, **overrides: Any) -> SandboxLimits:
        values = dict(
            timeout_s=limits.shell_timeout_s,
            cpu_s=limits.cpu_s,
            memory_mb=limits.memory_mb,
            file_size_mb=limits.file_size_mb,
            processes=limits.processes,
            workspace_mb=limits.workspace_mb,
            tmp_mb=limits.scratch_mb,
            tmp_on_disk=limits.scratch == "disk",
            limit_address_space=limits.limit_address_space,
        )
        env = {**limits.env, **overrides.pop("extra_env", {})}  # the spec's pins, then the caller's own
        return cls(**{**values, **overrides, "extra_env": env})

    @property
    def shm_mb(self) -> int:
        """/dev/shm is memory whatever /tmp is: with /tmp on disk, at most half the tree's memory."""
        return min(self.tmp_mb, self.memory_mb // 2) if self.tmp_on_disk else self.tmp_mb


MEMORY_LIMITS = ("cgroup v1", "cgroup v2", "sampled")  # SandboxResult.memory_limit


@dataclass
class SandboxResult:
    exit_code: int  # negative: killed by that signal (Popen convention)
    stdout: str
    stderr: str
    timed_out: bool
    # wall_timeout | cpu_limit | file_size_limit | memory_limit | workspace_quota | scratch_quota | output_limit
    # | stopped | signal:NAME | None
    killed_reason: str | None
    network_isolated: bool
    duration_s: float
    applied: dict = field(default_factory=dict)
    note: str = ""
    truncated: bool = False
    # what held the tree's memory: "cgroup v1" / "cgroup v2" (the kernel, every page of every
    # process: page cache, memfds, socket buffers) or "sampled" (the supervisor's PSS samples)
    memory_limit: str = "sampled"

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- file tools


def resolve_in_workspace(workspace: str | Path, relpath: str | Path) -> Path:
    """The absolute path of `relpath` inside `workspace`; raises SandboxEscape if it would leave it.

    Symlinks are resolved (also for a path that does not exist yet: its existing parents are), so a
    link inside the workspace that points outside is an escape too.
    """
    rel = str(relpath)
    if not rel.strip():
        raise SandboxEscape("empty path: expected a path relative to the workspace")
    if "\x00" in rel:
        raise SandboxEscape(f"path {rel!r} contains a NUL byte")
    if os.path.isabs(rel) or rel.startswith("~"):
        raise SandboxEscape(f"path {rel!r} is absolute: expected a path relative to the workspace")
    root = Path(workspace).resolve()
    target = (root / rel).resolve()  # strict=False: resolves every existing component, links included
    if target != root and root not in target.parents:
        raise SandboxEscape(f"path {rel!r} leaves the workspace (resolves to {target})")
    return target


# ---------------------------------------------------------------- parent side


def sandbox_env(
    workspace: Path, tmpdir: Path, extra: dict[str, str] | None = None, path_first: str | None = None
) -> dict[str, str]:
    """The child's whole environment: an allow-list, never the host's secrets."""
    env = {k: os.environ[k] for k in ENV_ALLOW if os.environ.get(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    if path_first:
        env["PATH"] = os.pathsep.join([path_first, *(p for p in env["PATH"].split(os.pathsep) if p != path_first)])
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(workspace),
        TMPDIR=str(tmpdir),
        PWD=str(workspace),
        USER="sandbox",
        LOGNAME="sandbox",
        SHELL="/bin/sh",
        TERM="dumb",
        PYTHONDONTWRITEBYTECODE="1",
        # Bytecode is read from (and would be written to) this tree only, never a workspace
        # __pycache__: an unchecked hash-based .pyc the agent left there is not what gets imported.
        PYTHONPYCACHEPREFIX=str(tmpdir / "pycache"),
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
        PYTHONPATH=str(POLICY_SITE),
        PIP_NO_INPUT="1",
        # Caches would otherwise land in HOME, i.e. in the workspace that gets bundled and compared.
        XDG_CACHE_HOME=str(tmpdir / "cache"),
        MPLCONFIGDIR=str(tmpdir / "matplotlib"),
        MPLBACKEND="Agg",  # no display: plots go to files
    )
    env.update(extra or {})
    return env


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _topmost(dirs: list[str]) -> list[str]:
    """`dirs` without those lying inside another one of them."""
    return sorted(d for d in set(dirs) if not any(o != d and _within(d, o) for o in dirs))


def project_interpreter() -> tuple[str, list[str]]:
    """(bin dir to put first on PATH, directories it needs) of the interpreter running this process.

    The bin dir stays unresolved so `python` finds its venv's pyvenv.cfg; the directories are the venv
    and the installation it was made from (where the real binary, stdlib and libpython live).
    """
    exe = os.path.abspath(sys.executable)
    real_bin = os.path.dirname(os.path.realpath(exe))
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    return os.path.dirname(exe), _topmost([os.path.realpath(p) for p in prefixes] + [real_bin])


@lru_cache(maxsize=1)
def _tools() -> tuple[str | None, str | None]:
    """(bwrap, setpriv) when bwrap can build a sandbox on this machine, else (None, reason)."""
    import shutil
    import subprocess

    bwrap, setpriv = shutil.which("bwrap"), shutil.which("setpriv")
    if not bwrap:
        return None, "bwrap (bubblewrap) is not installed"
    if os.geteuid() == 0 and not (setpriv and _within(os.path.realpath(setpriv), "/usr")):
        return None, "setpriv (util-linux) is not installed under /usr"
    # The mounts every call makes, too: in a container a new PID namespace may be allowed while
    # mounting its /proc is not, and every command would then fail instead of falling back.
    probe = [
        bwrap,
        *_namespace_flags(os.geteuid() == 0, True),
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "true",
    ]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap cannot start: {exc}"
    if out.returncode != 0:
        return None, f"bwrap cannot create namespaces here: {out.stderr.strip()[:300]}"
    return bwrap, setpriv


def _namespace_flags(as_root: bool, isolate_network: bool) -> list[str]:
    flags = ["--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
    flags += ["--unshare-cgroup-try"] + (["--unshare-net"] if isolate_network else [])
    # As root no user namespace: its uid map would make the command host root (and exempt from
    # RLIMIT_NPROC); setpriv drops to the leased uid instead. As a user: a user namespace.
    return flags + ([] if as_root else ["--unshare-user"])


def bwrap_argv(
    bwrap: str, setpriv: str | None, cmd: str, workspace: str, read_only: list[str], limits: SandboxLimits,
    uid: int | None, scratch: Path | None = None,
) -> list[str]:  # fmt: skip
    """The bwrap command line of one call (see the module docstring for the view it builds);
    `scratch`: the host folder that is its /tmp, else a tmpfs."""
    as_root = os.geteuid() == 0
    argv = [bwrap, *_namespace_flags(as_root, limits.isolate_network), "--cap-drop", "ALL"]
    if uid is not None:  # setpriv needs these three to drop to the uid; it then drops them all
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    tmp_bytes, shm_bytes = str(limits.tmp_mb * 1024 * 1024), str(limits.shm_mb * 1024 * 1024)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # The new /proc still writes host-wide kernel settings (a root command without capabilities
    # could set core_pattern): read-only over it.
    argv += [a for p in ("/proc/sys", "/proc/sysrq-trigger") if os.path.exists(p) for a in ("--ro-bind", p, p)]
    argv += ["--perms", "1777", "--size", shm_bytes, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--bind", str(scratch), "/tmp"] if scratch else ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp"]
    system = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    binds = [(d, "--ro-bind") for d in _topmost(read_only) if not any(_within(d, s) for s in system)]
    binds += [(os.path.realpath(d), "--bind") for d in limits.writable]
    binds.append((workspace, "--bind"))
    made: set[str] = {"/", "/tmp", "/dev", "/proc"}
    for path, how in binds:
        parents = []
        p = os.path.dirname(path)
        while p not in made and p != "/":
            parents.append(p)
            p = os.path.dirname(p)
        for p in reversed(parents):  # enterable by the uid, unlike a private home on the host
            argv += ["--perms", "0755", "--dir", p]
            made.add(p)
        argv += [how, path, path]
        made.add(path)
    for inside in _inside_workspace(workspace, limits.read_only_paths):
        argv += ["--ro-bind", inside, inside]
    if limits.egress_socket and limits.isolate_network:
        argv += ["--dir", "/run", "--ro-bind", limits.egress_socket, SANDBOX_SOCKET]
    if uid is not None:  # the leased uid has a name, as programs that ask for their user expect
        argv += [a for f in identity_files(uid) for a in ("--ro-bind", str(f), f"/etc/{f.name.split('-')[0]}")]
    argv += ["--remount-ro", "/"]
    if uid is None:
        return argv + ["--chdir", workspace, "--", "/bin/sh", "-c", cmd]
    argv += ["--", setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
    # The workspace may be 0700 (owned by the uid): entered as the uid, not by capless root.
    enter = 'cd -- "$1" || exit 126; exec /bin/sh -c "$2"'
    return argv + ["--bounding-set=-all", "--no-new-privs", "--", "/bin/sh", "-c", enter, "sh", workspace, cmd]


def _inside_workspace(workspace: str, rels: tuple[str, ...]) -> list[str]:
    """The existing paths of `rels` in the workspace, resolved, those that would leave it left out."""
    out = []
    for rel in rels:
        try:
            path = resolve_in_workspace(workspace, rel)
        except SandboxEscape:
            continue
        if path.exists() and str(path) != str(Path(workspace).resolve()):
            out.append(str(path))
    return out


def _seal(workspace: Path, rels: tuple[str, ...]) -> None:
    """Without a mount namespace: the write bits off `rels` (their owner could set them again, so a
    write still shows as a changed protected path; an interpreter simply writes no bytecode there)."""
    import stat

    for top in _inside_workspace(str(workspace), rels):
        for p in [Path(top), *(Path(top).rglob("*") if Path(top).is_dir() else [])]:
            if not p.is_symlink():
                p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _visible_path(path: str, visible_dirs: list[str]) -> str:
    """PATH without the host's entries that the sandbox does not show (e.g. ~/.cargo/bin)."""
    keep = [e for e in path.split(os.pathsep) if e and any(_within(os.path.realpath(e), d) for d in visible_dirs)]
    return os.pathsep.join(keep)


def run_sandboxed(
    cmd: str, cwd: str | Path, limits: SandboxLimits | None = None, stop: threading.Event | None = None
) -> SandboxResult:
    """Run `/bin/sh -c cmd` in workspace `cwd` under `limits`; see the module docstring. Setting
    `stop` kills the tree at the next sample (killed_reason "stopped")."""
    import tempfile

    limits = limits or SandboxLimits()
    workspace = Path(cwd).resolve()
    if not workspace.is_dir():
        raise FileNotFoundError(f"sandbox cwd {workspace} is not a directory")
    if (refusal := sandbox_refusal()) is not None:
        raise SandboxUnavailable(refusal)
    as_root = os.geteuid() == 0
    # Without namespaces a leased uid runs the host's paths as they are: one that cannot enter the
    # interpreter's folders (a venv under a 0700 home) would fail every command with 126.
    drop = (
        as_root
        and limits.drop_privileges
        and (_tools()[0] is not None or (_open_to_others(sys.executable) and _open_to_others(str(workspace.parent))))
    )
    uid = lease_uid(str(workspace), limits) if drop else None
    host_tmp = None
    try:
        if uid is not None:
            for tree in (workspace, *limits.writable):
                own_tree(Path(tree), uid, uid)
        bwrap, setpriv_or_reason = _tools()
        # a private temp dir of the host is /tmp: asked for (on disk), or where no namespaces stand in
        if bwrap is None or limits.tmp_on_disk:
            host_tmp = Path(tempfile.mkdtemp(prefix="mass-sandbox-"))
            if uid is not None:
                os.chown(host_tmp, uid, uid)
        return _run(cmd, workspace, limits, uid, bwrap, setpriv_or_reason, host_tmp, stop)
    finally:
        if host_tmp is not None:
            remove_tree(host_tmp)
        if uid is not None:
            release_uid(str(workspace))


def remove_tree(root: Path) -> None:
    """Remove a tree a sandboxed command wrote, folders it made unreadable or unwritable included."""
    import shutil
    import stat

    def retry(func, path, _exc) -> None:
        try:
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            os.chmod(path, stat.S_IRWXU) if os.path.isdir(path) and not os.path.islink(path) else None
            func(path)
        except OSError:
            pass

    shutil.rmtree(root, onerror=retry)


def _open_to_others(path: str) -> bool:
    """Whether any uid can reach `path` and run (or enter) it: it and every folder above it open to others."""
    import stat

    real = Path(os.path.realpath(path))
    try:
        return all(p.stat().st_mode & stat.S_IXOTH for p in (real, *real.parents))
    except OSError:
        return False


@dataclass
class _Launch:
    """What one sandboxed command is started with, and what is on record of how."""

    argv: list[str]
    env: dict[str, str]
    rlimits: dict[str, list[int]]
    applied: dict[str, Any]
    notes: list[str]
    python: dict[str, Any]


def _run(
    cmd: str, workspace: Path, limits: SandboxLimits, uid: int | None, bwrap: str | None, tool: str | None,
    host_tmp: Path | None, stop: threading.Event | None = None,
) -> SandboxResult:  # fmt: skip
    import subprocess

    # set up
    launch = _launch(cmd, workspace, limits, uid, bwrap, tool, host_tmp)
    cgroup = memory_cgroup(limits, launch.notes)
    # the launcher applies the rlimits (and, without bwrap, the uid) in the child, then execs argv
    order = {"argv": launch.argv, "rlimits": launch.rlimits, "uid": None if bwrap else uid, "cwd": str(workspace)}
    launcher = [sys.executable, "-I", "-S", str(LAUNCHER.resolve()), "--launch", json.dumps(order)]
    # run
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            cgroup.wrap(launcher) if cgroup else launcher,
            cwd=workspace,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: the timeout kills all of it
            close_fds=True,
        )
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    sinks: dict[str, dict] = {"out": {}, "err": {}}
    readers = [
        threading.Thread(target=read_capped, args=(proc.stdout, limits.output_bytes, sinks["out"]), daemon=True),
        threading.Thread(target=read_capped, args=(proc.stderr, limits.output_bytes, sinks["err"]), daemon=True),
    ]
    for t in readers:
        t.start()
    reason, peak, why = supervise(proc, workspace, limits, t0, sinks, stop, cgroup, host_tmp)
    if cgroup is not None:
        if cgroup.oom_kills() and reason is None:
            reason, why = (
                "memory_limit",
                f"the kernel's OOM killer ended the tree at its {limits.memory_mb} MB cgroup limit",
            )
        peak["mem"] = max(peak["mem"], cgroup.peak_bytes() / (1024 * 1024))
        cgroup.remove()  # and with it anything of the tree still alive
    if why:
        launch.notes.append(why)
    for t in readers:
        t.join(timeout=2)
    if any(t.is_alive() for t in readers):  # without a PID namespace an escapee may hold the pipes
        kill_tree(proc.pid)
        for t in readers:
            t.join(timeout=2)
    # record
    return _record(
        launch, proc.returncode, reason, peak, sinks, time.monotonic() - t0, workspace, limits, uid, cgroup, host_tmp
    )


def _launch(
    cmd: str,
    workspace: Path,
    limits: SandboxLimits,
    uid: int | None,
    bwrap: str | None,
    tool: str | None,
    host_tmp: Path | None,
) -> _Launch:
    """The command's argv (under bwrap, or a plain shell where none may be built), environment and
    rlimits, and the record of what they apply."""
    as_root = os.geteuid() == 0
    python: dict[str, Any] = {"mode": limits.python}
    read_only: list[str] = []
    if limits.python == "project":
        python["path_first"], python["read_only"] = project_interpreter()
        read_only = [*python["read_only"], *([str(POLICY_SITE)] if POLICY_SITE.is_dir() else [])]
    read_only += [os.path.realpath(d) for d in limits.read_only]
    tmp = Path("/tmp") if bwrap else host_tmp
    assert tmp is not None
    env = sandbox_env(workspace, tmp, limits.extra_env, python.get("path_first"))
    notes: list[str] = []
    applied: dict[str, Any] = {
        "backend": "bwrap" if bwrap else "none",
        "boundary": "bwrap" if bwrap else outer_boundary(),
    }
    egress = bool(bwrap and limits.egress_socket and limits.isolate_network)
    if egress:  # the relay first; the command starts once it listens (it is the command's only way out)
        cmd = _behind_relay(cmd, limits)
        env.update(sandbox_proxy_env())
    elif limits.egress_socket:
        notes.append("egress proxy not used: the command's network is not isolated here")
    elif limits.egress_url:
        env.update(sandbox_proxy_env(limits.egress_url))
        notes.append("network: the pod's NetworkPolicy, through the run's egress proxy")
    if bwrap:
        env["PATH"] = _visible_path(env["PATH"], [*SYSTEM_DIRS, *read_only, str(workspace)])
        argv = bwrap_argv(bwrap, tool, cmd, str(workspace), read_only, limits, uid, host_tmp)
        applied.update(
            pid_namespace=True, mount_namespace=True, network_namespace=limits.isolate_network,
            exposed={**{d: "ro" for d in _topmost(read_only)}, **{d: "rw" for d in limits.writable}, str(workspace): "rw"},
            private_tmpfs={"/dev/shm": limits.shm_mb, **({} if host_tmp else {"/tmp": limits.tmp_mb})}, egress_proxy=egress,
            read_only_in_workspace=[os.path.relpath(p, workspace) for p in _inside_workspace(str(workspace), limits.read_only_paths)],
        )  # fmt: skip
        if not as_root:
            applied["user_namespace"] = True
    else:
        argv = ["/bin/sh", "-c", cmd]
        _seal(workspace, limits.read_only_paths)
        applied.update(pid_namespace=False, mount_namespace=False, network_namespace=False)
        notes.append(
            f"no sandbox namespaces ({tool}): network reachable, host filesystem visible; "
            f"bounded by {OUTER_BOUNDARIES[outer_boundary() or 'none']}"
        )
    if not limits.isolate_network and not limits.egress_url:
        notes.append("network isolation switched off by the limits")
    return _Launch(argv, env, _rlimits(limits), applied, notes, python)


def _behind_relay(cmd: str, limits: SandboxLimits) -> str:
    """`cmd` started once the egress relay listens in the sandbox: its one way out is the socket."""
    import shlex

    python = sys.executable if limits.python == "project" else "python3"
    relay = shlex.join([python, "-I", "-S", "-c", FORWARDER, str(SANDBOX_PORT), SANDBOX_SOCKET])
    return f"{relay} </dev/null >/dev/null 2>&1 || {{ echo 'the egress relay did not start' >&2; exit 125; }}\n{cmd}"


def _rlimits(limits: SandboxLimits) -> dict[str, list[int]]:
    mb = 1024 * 1024
    return {
        "RLIMIT_CPU": [limits.cpu_s, limits.cpu_s + 1],  # SIGXCPU first, SIGKILL a second later
        "RLIMIT_AS": [limits.memory_mb * mb if limits.limit_address_space else -1] * 2,  # -1: RLIM_INFINITY
        "RLIMIT_FSIZE": [limits.file_size_mb * mb] * 2,
        "RLIMIT_NPROC": [limits.processes] * 2,
        "RLIMIT_NOFILE": [limits.open_files] * 2,
        "RLIMIT_CORE": [0, 0],
    }


def _record(
    launch: _Launch,
    code: int,
    reason: str | None,
    peak: dict,
    sinks: dict,
    duration: float,
    workspace: Path,
    limits: SandboxLimits,
    uid: int | None,
    cgroup,
    host_tmp: Path | None,
) -> SandboxResult:
    """The command's result, with what was applied and what it used."""
    applied, notes, rlimits = launch.applied, launch.notes, launch.rlimits
    killed = reason is not None
    if not killed and (quota := over_quota(workspace, limits, host_tmp)):  # written between two samples
        reason = quota[0]
        notes.append(quota[1])
    applied["scratch"] = {"path": "/tmp", "on": "disk" if host_tmp else "memory", "mb": limits.tmp_mb}
    applied.update(rlimits={k: v[0] for k, v in rlimits.items()}, wall_timeout_s=limits.timeout_s, python=launch.python)
    applied["tree_limits"] = {
        "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
        "workspace_mb": limits.workspace_mb, "workspace_files": limits.workspace_files,
    }  # fmt: skip
    applied["uid"] = applied["gid"] = uid if uid is not None else os.getuid()
    applied["usage"] = {"cpu_s": round(peak["cpu"], 3), "max_memory_mb": round(peak["mem"], 1)}
    as_root = os.geteuid() == 0
    if as_root and uid is None:
        why = (
            "drop_privileges off"
            if not limits.drop_privileges
            else "no other uid can reach the interpreter or the workspace"
        )
        notes.append(f"ran as root ({why}): NPROC not enforced, files outside the workspace writable")
    elif not as_root:
        notes.append(f"ran as the caller's uid {os.getuid()}: its process budget is shared with the caller")
    out, err = sinks["out"].get("data", b""), sinks["err"].get("data", b"")
    dropped = sinks["out"].get("dropped", 0) + sinks["err"].get("dropped", 0)
    if dropped:
        notes.append(f"output over {limits.output_bytes} bytes per stream: {dropped} bytes dropped")
    return SandboxResult(
        exit_code=-signal.SIGKILL if killed else code,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        timed_out=reason == "wall_timeout",
        killed_reason=reason or signal_reason(code, limits, peak),
        memory_limit=f"cgroup v{cgroup.version}" if cgroup is not None else "sampled",
        network_isolated=bool(applied.get("network_namespace")),
        duration_s=round(duration, 4),
        applied=applied,
        note="; ".join(notes),
        truncated=bool(dropped),
    )
