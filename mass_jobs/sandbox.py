"""Local sandbox for the shell commands an agent writes and for guard checks.

`run_sandboxed(cmd, cwd, limits)` runs `/bin/sh -c cmd` in the workspace `cwd`, one fresh process
tree per call, with:
- a scrubbed environment (an allow-list: PATH, HOME=workspace, TMPDIR inside the workspace, LANG,
  ...; no credentials, tokens or cloud settings of the host);
- rlimits on CPU seconds, address space, file size and process count, and no core dumps;
- a wall-clock timeout that kills the whole process tree;
- where the OS allows it (root, or unprivileged user namespaces): a new network namespace (no
  network at all, only a private loopback), a new PID namespace (every descendant dies with the
  call) and a new mount namespace whose world-writable directories (/tmp, /var/tmp, /dev/shm) are
  read-only, the workspace excepted; as root the command runs as an unprivileged uid (default
  nobody) so NPROC counts and nothing outside the workspace is writable;
- the project's own interpreter (this process's venv and its base installation) as `python`, first
  on PATH and bound read-only, so research code gets numpy/matplotlib/torch. An interpreter under a
  private home (e.g. /root, mode 0700) is reached by covering that home, and every other private
  (no o+x) ancestor and the caller's home, with an empty tmpfs and binding back only the needed
  directories: the rest of the home (~/.ssh, ~/.aws, ~/.config) does not exist in the sandbox.
  `SandboxLimits(python="system")` keeps the host's PATH and exposes nothing.
What was applied comes back in `SandboxResult.applied` and `.note`; what could not be applied is
named there and `network_isolated` is False when the network stayed reachable.

The isolation is set up by this file run as a script (`python -I sandbox.py --child CONFIG`) in a
fresh single-threaded interpreter, never in a fork of the (threaded) caller. Cluster pods add their
own boundary (non-root, read-only root filesystem, NetworkPolicy); this is the local one.

`resolve_in_workspace(workspace, rel)` maps a file-tool path into the workspace or raises
`SandboxEscape` (absolute paths, `..` escapes, symlinks pointing outside).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mass_jobs.models import EpisodeLimits

# Only stdlib imports above: this file also runs as a script in the sandbox child.

ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READONLY_DIRS = ("/tmp", "/var/tmp")  # world-writable on the host: covered read-only
PRIVATE_DIRS = ("/dev/shm",)  # multiprocessing needs it writable: a private tmpfs that dies with the call
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18,
)  # fmt: skip
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# statvfs flag -> mount flag: a read-only bind remount must repeat the flags the host mount has
# (in a user namespace they are locked and leaving one out fails with EPERM).
ST_TO_MS = ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
PYTHON_MODES = ("project", "system")


class SandboxEscape(ValueError):
    """A path that would leave the workspace."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120
    cpu_s: int = 120
    memory_mb: int = 2048
    file_size_mb: int = 256
    processes: int = 64
    isolate_network: bool = True
    drop_privileges: bool = True  # as root: run the command as `uid`/`gid`
    uid: int = 65534
    gid: int = 65534
    output_bytes: int = 1_000_000  # per stream; the rest is counted and dropped
    extra_env: dict[str, str] = field(default_factory=dict)
    python: str = "project"  # project: this process's interpreter, read-only, first on PATH; system: host PATH

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
        )
        return cls(**{**values, **overrides})


@dataclass
class SandboxResult:
    exit_code: int  # negative: killed by that signal (Popen convention)
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # wall_timeout | cpu_limit | file_size_limit | memory_limit | signal:NAME | None
    network_isolated: bool
    duration_s: float
    applied: dict = field(default_factory=dict)
    note: str = ""
    truncated: bool = False

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
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
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


def _private_ancestors(path: str) -> list[str]:
    """Ancestors of `path` that other users cannot enter (no o+x), like a 0700 home."""
    found = []
    parent = os.path.dirname(path)
    while parent != "/":
        if not os.stat(parent).st_mode & 0o001:
            found.append(parent)
        parent = os.path.dirname(parent)
    return found


def _homes() -> list[str]:
    """Home directories of the caller and of the interpreter's owner: where credentials live."""
    import pwd

    homes = [os.environ.get("HOME", "")]
    for uid in {os.getuid(), os.stat(os.path.realpath(sys.executable)).st_uid}:
        try:
            homes.append(pwd.getpwuid(uid).pw_dir)
        except KeyError:  # a uid without a passwd entry (some containers)
            pass
    return [os.path.realpath(h) for h in homes if h and os.path.isdir(h)]


def file_view(workspace: str | Path, read_only: list[str]) -> dict:
    """What the mount namespace changes: `cover` dirs get an empty read-only tmpfs; `bind` paths
    ([path, writable]) are bound back on top (the workspace writable, `read_only` dirs read-only).

    Covered: the world-writable dirs, every private ancestor of an exposed path and the home dirs,
    the topmost of them only, never one inside an exposed path.
    """
    ws = str(Path(workspace).resolve())
    # A read-only dir holding the workspace would make the workspace read-only: left as it is.
    ro = [d for d in _topmost([os.path.realpath(d) for d in read_only]) if not _within(ws, d)]
    exposed = [ws, *ro]
    candidates = [d for d in READONLY_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    candidates += [a for e in exposed for a in _private_ancestors(e)] + _homes()
    cover = _topmost([c for c in candidates if c != "/" and not any(_within(c, e) for e in exposed)])
    bind = [[ws, True]] if any(_within(ws, c) for c in cover) else []
    return {"cover": cover, "bind": bind + [[d, False] for d in ro]}


def _visible_path(path: str, view: dict) -> str:
    """PATH without the host's entries that the sandbox covers (e.g. ~/.cargo/bin)."""

    def visible(entry: str) -> bool:
        real = os.path.realpath(entry)
        hidden = any(_within(real, c) for c in view["cover"])
        return not hidden or any(_within(real, b) for b, _ in view["bind"])

    return os.pathsep.join(e for e in path.split(os.pathsep) if e and visible(e))


def _own_tree(root: Path, uid: int, gid: int) -> None:
    """Hand the workspace to the sandbox uid so the command can write there (and only there)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            try:
                st = os.lstat(name)
                if st.st_uid != uid or st.st_gid != gid:
                    os.lchown(name, uid, gid)
            except FileNotFoundError:
                pass


def _reader(stream: Any, cap: int, sink: dict) -> None:
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


def run_sandboxed(cmd: str, cwd: str | Path, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `/bin/sh -c cmd` in workspace `cwd` under `limits`; see the module docstring."""
    import secrets
    import shutil
    import subprocess
    import threading

    limits = limits or SandboxLimits()
    workspace = Path(cwd).resolve()
    if not workspace.is_dir():
        raise FileNotFoundError(f"sandbox cwd {workspace} is not a directory")
    tmpdir = workspace / ".tmp" / secrets.token_hex(4)
    tmpdir.mkdir(parents=True)
    as_root = os.geteuid() == 0
    drop = as_root and limits.drop_privileges
    if drop:
        _own_tree(workspace, limits.uid, limits.gid)
    python: dict[str, Any] = {"mode": limits.python}
    if limits.python == "project":
        python["path_first"], python["read_only"] = project_interpreter()
    status_r, status_w = os.pipe()
    config = {
        "cmd": cmd,
        "status_fd": status_w,
        "workspace": str(workspace),
        "limits": {k: v for k, v in asdict(limits).items() if k != "extra_env"},
        "drop": drop,
        "as_root": as_root,
        "view": file_view(workspace, python.get("read_only", [])),
    }
    env = sandbox_env(workspace, tmpdir, limits.extra_env, python.get("path_first"))
    env["PATH"] = _visible_path(env["PATH"], config["view"])
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--child", json.dumps(config)],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # own process group: the timeout kills all of it
        pass_fds=(status_w,),
        close_fds=True,
    )
    os.close(status_w)
    sinks: dict[str, dict] = {"out": {}, "err": {}}
    readers = [
        threading.Thread(target=_reader, args=(proc.stdout, limits.output_bytes, sinks["out"]), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, limits.output_bytes, sinks["err"]), daemon=True),
    ]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        proc.wait()
    # Descendants that left the process group (setsid) may still hold the pipes open; with a PID
    # namespace they died with its init, without one they are killed by group here as a last resort.
    for t in readers:
        t.join(timeout=2)
    if any(t.is_alive() for t in readers):
        _kill_group(proc.pid)
        for t in readers:
            t.join(timeout=2)
    duration = time.monotonic() - t0
    with os.fdopen(status_r, "rb") as f:
        raw_status = f.read()
    shutil.rmtree(tmpdir, ignore_errors=True)
    try:
        tmpdir.parent.rmdir()  # .tmp goes when no concurrent call still uses it
    except OSError:
        pass
    child = _parse_status(raw_status)
    applied = child.get("applied", {})
    applied.update({k: child[k] for k in ("rlimits", "uid", "gid") if k in child})
    applied["wall_timeout_s"] = limits.timeout_s
    applied["python"] = python
    if "cpu_s" in child:
        applied["usage"] = {"cpu_s": child["cpu_s"], "max_rss_mb": child.get("max_rss_mb")}
    notes = list(child.get("notes", []))
    if as_root and not drop:
        notes.append("ran as root (drop_privileges off): NPROC not enforced, files outside the workspace writable")
    elif not as_root:
        notes.append(f"ran as the caller's uid {os.getuid()}: it can write wherever that uid can")
    if child.get("setup_error"):
        notes.append("sandbox setup failed: " + child["setup_error"])
    exit_code, sig = _exit_of(proc.returncode, child)
    out, err = sinks["out"].get("data", b""), sinks["err"].get("data", b"")
    dropped = sinks["out"].get("dropped", 0) + sinks["err"].get("dropped", 0)
    if dropped:
        notes.append(f"output over {limits.output_bytes} bytes per stream: {dropped} bytes dropped")
    return SandboxResult(
        exit_code=-signal.SIGKILL if timed_out else exit_code,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        timed_out=timed_out,
        killed_reason=_killed_reason(timed_out, exit_code, sig, child, limits),
        network_isolated=bool(applied.get("network_namespace")),
        duration_s=round(duration, 4),
        applied=applied,
        note="; ".join(notes),
        truncated=bool(dropped),
    )


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _parse_status(raw: bytes) -> dict:
    status: dict = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            part = json.loads(line)
        except ValueError:
            continue
        notes = status.get("notes", []) + part.pop("notes", [])  # several processes add notes
        status.update(part, notes=notes)
    return status


def _exit_of(returncode: int, child: dict) -> tuple[int, int | None]:
    """(exit code, terminating signal) of the command itself, as its supervisor saw it."""
    if "signal" in child and child["signal"]:
        return -child["signal"], child["signal"]
    if "exit_code" in child:
        return child["exit_code"], None
    if returncode < 0:
        return returncode, -returncode
    return returncode, None


def _killed_reason(timed_out: bool, exit_code: int, sig: int | None, child: dict, limits: SandboxLimits) -> str | None:
    if timed_out:
        return "wall_timeout"
    cpu = child.get("cpu_s", 0.0)
    if sig is None and exit_code > 128 and exit_code - 128 in (signal.SIGXCPU, signal.SIGXFSZ, signal.SIGKILL):
        sig = exit_code - 128  # the shell reported a signalled child
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_s - 0.05):
        return "cpu_limit"
    if sig == signal.SIGXFSZ:
        return "file_size_limit"
    if sig in (signal.SIGSEGV, signal.SIGKILL, signal.SIGABRT) and child.get("max_rss_mb", 0) >= 0.9 * limits.memory_mb:
        return "memory_limit"
    if sig:
        return f"signal:{signal.Signals(sig).name}"
    return None


# ---------------------------------------------------------------- child side (runs as a script)


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc


def _call(libc: Any, name: str, *args: Any) -> None:
    import ctypes

    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40)  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
        fcntl.ioctl(s.fileno(), 0x8914, ifreq)  # SIOCSIFFLAGS


def _write_id_maps(uid: int, gid: int) -> None:
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _private_shm(libc: Any, shm_mb: int, notes: list[str]) -> list[str]:
    done = []
    for d in PRIVATE_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            try:
                opts = f"size={shm_mb}m,mode=1777".encode()
                _call(libc, "mount", b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts)
                done.append(d + " (private)")
            except OSError as e:
                notes.append(f"could not cover {d}: {e}")
    return done


def _bind(libc: Any, fd: int, path: str, writable: bool) -> None:
    _call(libc, "mount", f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None)
    if not writable:
        locked = os.statvfs(path).f_flag
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        flags |= sum(ms for st, ms in ST_TO_MS if locked & st and ms not in (MS_NOSUID, MS_NODEV))
        _call(libc, "mount", None, path.encode(), None, flags, None)


def _apply_view(libc: Any, view: dict, notes: list[str]) -> tuple[list[str], dict[str, str]]:
    """Cover `view["cover"]` with empty tmpfs and bind `view["bind"]` back (see `file_view`);
    returns (covered dirs, {path: "rw" | "ro"} actually bound)."""
    # Every bound dir is held by an fd first: covering its parent would hide it.
    held = []
    for path, writable in view["bind"]:
        try:
            held.append((path, writable, os.open(path, os.O_RDONLY | os.O_DIRECTORY)))
        except OSError as e:
            notes.append(f"could not expose {path}: {e}")
    covered, exposed = [], {}

    def bind(path: str, writable: bool, fd: int) -> None:
        try:
            os.makedirs(path, exist_ok=True)  # the mount point, inside a fresh cover
            _bind(libc, fd, path, writable)
            exposed[path] = "rw" if writable else "ro"
        except OSError as e:
            notes.append(f"could not expose {path}: {e}")

    under_cover = [h for h in held if any(_within(h[0], c) for c in view["cover"])]
    for h in held:
        if h not in under_cover:  # visible already: made read-only in place before anything covers its insides
            bind(*h)
    for d in view["cover"]:
        try:
            _call(libc, "mount", b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755")
            covered.append(d)
        except OSError as e:
            notes.append(f"could not cover {d}: {e}")
    old_umask = os.umask(0o022)  # mount points in a cover must be enterable by the sandbox uid
    for h in sorted(under_cover, key=lambda h: h[0].count("/")):
        bind(*h)
    os.umask(old_umask)
    for d in covered:
        try:
            _call(libc, "mount", None, d.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        except OSError as e:
            notes.append(f"cover {d} stays writable: {e}")
    for *_, fd in held:
        os.close(fd)
    return covered, exposed


def _set_rlimits(limits: dict) -> dict:
    import resource

    mb = 1024 * 1024
    wanted = {
        "RLIMIT_CPU": (limits["cpu_s"], limits["cpu_s"] + 1),  # SIGXCPU first, SIGKILL a second later
        "RLIMIT_AS": (limits["memory_mb"] * mb,) * 2,
        "RLIMIT_FSIZE": (limits["file_size_mb"] * mb,) * 2,
        "RLIMIT_NPROC": (limits["processes"],) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    for name, value in wanted.items():
        resource.setrlimit(getattr(resource, name), value)
    return {name: value[0] for name, value in wanted.items()}


def _child_main(config: dict) -> None:
    """Supervisor in the sandbox: namespaces, then init (pid 1), then the command as the sandbox uid."""
    import resource  # noqa: F401 - imported now: the mounts below may hide this interpreter's own files
    limits = config["limits"]
    status_fd = config["status_fd"]
    notes: list[str] = []
    applied: dict[str, Any] = {}

    def report(**kw: Any) -> None:
        os.write(status_fd, (json.dumps(kw) + "\n").encode())

    libc = _libc()
    uid, gid = (limits["uid"], limits["gid"]) if config["drop"] else (os.getuid(), os.getgid())
    flags = CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWNET if limits["isolate_network"] else 0)
    try:
        if config["as_root"]:
            _call(libc, "unshare", flags)
        else:
            real_uid, real_gid = os.getuid(), os.getgid()
            _call(libc, "unshare", flags | CLONE_NEWUSER)
            _write_id_maps(real_uid, real_gid)
            applied["user_namespace"] = True
        applied["pid_namespace"] = True
        applied["mount_namespace"] = True
        applied["network_namespace"] = bool(limits["isolate_network"])
    except OSError as e:
        notes.append(f"no namespaces ({e}): network reachable, files outside the workspace writable by the uid")
        applied.update(pid_namespace=False, mount_namespace=False, network_namespace=False)
    if not limits["isolate_network"]:
        notes.append("network isolation switched off by the limits")
    if applied["network_namespace"]:
        try:
            _loopback_up()
            applied["loopback"] = True
        except OSError as e:
            notes.append(f"private loopback stays down: {e}")
    if applied["mount_namespace"]:
        try:
            _call(libc, "mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing propagates back to the host
            shm_mb = max(1, min(256, limits["memory_mb"] // 4))
            covered, applied["exposed"] = _apply_view(libc, config["view"], notes)
            applied["covered_dirs"] = _private_shm(libc, shm_mb, notes) + covered
        except OSError as e:
            notes.append(f"mount setup failed: {e}")
    elif config["view"]["bind"]:
        notes.append("no mount namespace: nothing covered or bound, interpreter dirs not made read-only")
    report(applied=applied, notes=notes)

    init = os.fork()
    if init == 0:
        _init(config, libc, status_fd, uid, gid, applied.get("pid_namespace", False), report)
    _, wstatus = os.waitpid(init, 0)
    code = os.waitstatus_to_exitcode(wstatus)
    os._exit(code if code >= 0 else 128 - code)


def _init(config: dict, libc: Any, status_fd: int, uid: int, gid: int, pid_ns: bool, report: Any) -> None:
    """PID 1 of the sandbox: mounts its /proc, starts the command, reports how it ended. Never returns."""
    try:
        _call(libc, "prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # supervisor killed -> whole namespace dies
        if pid_ns:
            try:
                _call(libc, "mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            except OSError as e:
                report(notes=[f"/proc still shows the host: {e}"])
        worker = os.fork()
        if worker == 0:
            try:
                # Python ignores these at startup and exec keeps ignored signals: give the command the defaults.
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                rl = _set_rlimits(config["limits"])
                if config["drop"]:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)
                _call(libc, "prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries cannot regain root
                report(rlimits=rl, uid=os.getuid(), gid=os.getgid())
                os.close(status_fd)
                os.chdir(config["workspace"])
                os.execv("/bin/sh", ["/bin/sh", "-c", config["cmd"]])
            except BaseException as e:  # noqa: BLE001 - anything here must end this process, not run on
                report(setup_error=f"{type(e).__name__}: {e}")
                os._exit(126)
        _, wstatus, usage = os.wait4(worker, 0)
        cpu = usage.ru_utime + usage.ru_stime
        result = {"cpu_s": round(cpu, 3), "max_rss_mb": round(usage.ru_maxrss / 1024, 1)}
        if os.WIFSIGNALED(wstatus):
            result["signal"] = os.WTERMSIG(wstatus)
        else:
            result["exit_code"] = os.WEXITSTATUS(wstatus)
        report(**result)
        os._exit(result.get("exit_code", 128 + result.get("signal", 0)))
    except BaseException as e:  # noqa: BLE001
        report(setup_error=f"{type(e).__name__}: {e}")
        os._exit(125)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--child":
    _child_main(json.loads(sys.argv[2]))
