"""The sandbox container's split on one machine: the same service started sandboxed in the episode's
workspace for qwen-code (`local_sandbox`), and the shell-only service its shell commands come back
out through (`shell_service`)."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path

from mass_jobs.config.errors import SandboxError
from mass_jobs.config.run_spec import EpisodeLimits
from mass_jobs.episodes.qwen_code import qwen_binary
from mass_jobs.episodes.sandbox_client import SandboxClient
from mass_jobs.episodes.sandbox_service import SandboxService, ServiceHandler, ServiceServer
from mass_jobs.sandbox.run import SandboxLimits, SandboxUnavailable, _tools, run_sandboxed, sandbox_refusal


@contextmanager
def local_sandbox(workspace: Path, limits: EpisodeLimits, egress: str | None = None):
    """The sandbox container on one machine, for qwen-code: the same service, started through
    `run_sandboxed` in the episode's workspace (bwrap: the workspace and the sockets' folder
    writable; read-only only what it needs to run, the `mass_jobs` package, the interpreter and the
    qwen-code install, never the checkout, a store, the spec or task files; a leased uid; rlimits
    over the episode) with the network shared, since qwen-code must reach the recording proxy on
    loopback. qwen-code's shell commands come back out through a shell-only service of this process
    (`shell.sock`) and each runs sandboxed on its own, as the built-in harness's do: namespaces of
    its own and no network (with `egress`, only the episode's egress proxy), so none of them sees
    qwen-code, its environment or the recording proxy. The
    trace and the status are outside every view. On leaving, whatever the sandbox still runs is
    killed within seconds. Where bwrap cannot run it raises SandboxUnavailable, unless this process
    declared an outer boundary (execution.sandbox: none): then it yields None and qwen-code runs in
    this process, as the status's sandbox note says."""
    import shlex
    import shutil
    import tempfile

    if _tools()[0] is None:
        if (refusal := sandbox_refusal()) is not None:
            raise SandboxUnavailable(refusal)
        yield None
        return
    sockdir = Path(tempfile.mkdtemp(prefix="mass-sandbox-"))
    sock, shell_sock = sockdir / "sandbox.sock", sockdir / "shell.sock"
    shells = _shell_server(shell_sock, workspace, limits, egress)
    try:
        qwen = qwen_binary()
    except FileNotFoundError:
        qwen = None  # qwen-code's start then fails in the sandbox and says so
    # the install the binary belongs to: .../node_modules/.bin/qwen -> the folder holding node_modules
    shown = [str(Path(__file__).resolve().parents[1])]  # the mass_jobs package
    if qwen is not None:
        real = Path(os.path.realpath(qwen))
        shown.append(str(next((p.parent for p in real.parents if p.name == "node_modules"), real.parent)))
    sl = SandboxLimits.from_episode_limits(
        limits,
        timeout_s=limits.wall_bound_s + 120,
        cpu_s=int(limits.wall_bound_s) + 120,
        processes=max(limits.processes, 256),
        isolate_network=False,
        limit_address_space=False,
        read_only=tuple(shown),
        writable=(str(sockdir),),
        extra_env={"MASS_QWEN_BIN": str(qwen)} if qwen else {},
    )
    cmd = (
        f"exec python -m mass_jobs.commands.cli sandbox-serve --socket {shlex.quote(str(sock))} "
        f"--workspace {shlex.quote(str(Path(workspace).resolve()))} --in-place "
        f"--shell-socket {shlex.quote(str(shell_sock))}"
    )
    ended: dict = {}
    stop = threading.Event()
    runner = threading.Thread(
        target=lambda: ended.update(result=run_sandboxed(cmd, workspace, sl, stop=stop)), daemon=True
    )
    runner.start()
    client = SandboxClient(sock, ready_s=60, shares_workspace=True)
    try:
        yield client
    finally:
        try:
            client._json("POST", "/shutdown", timeout_s=5)
        except SandboxError:
            pass
        runner.join(timeout=5)
        stop.set()  # a sandbox that lost its socket or would not stop: its whole tree is killed
        runner.join(timeout=10)
        shells.shutdown()
        shells.server_close()
        shutil.rmtree(sockdir, ignore_errors=True)


def _shell_server(path: Path, workspace: Path, limits: EpisodeLimits, egress: str | None = None) -> ServiceServer:
    """A shell-only service at `path`, served by a thread of this process (shutdown() ends it)."""
    server = ServiceServer(str(path), ServiceHandler)
    os.chmod(path, 0o666)
    server.service = SandboxService(workspace, routes=frozenset({"shell", "health"}), limits=limits, egress=egress)
    server.service.server = server
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server


@contextmanager
def shell_service(workspace: Path, limits: EpisodeLimits, egress: str | None = None):
    """The socket of a shell-only service in this process, for a qwen-code run started here (where
    bwrap cannot run): its shell commands still leave qwen-code's process tree and environment."""
    import shutil
    import tempfile

    sockdir = Path(tempfile.mkdtemp(prefix="mass-shell-"))
    server = _shell_server(sockdir / "shell.sock", workspace, limits, egress)
    try:
        yield sockdir / "shell.sock"
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(sockdir, ignore_errors=True)
