"""The sandbox container of an agent pod, and the harness's client for it.

On a cluster the agent pod has two containers with different uids. The harness container (the
pod's main container) runs `mass episode --sandbox SOCKET`: the recording proxy, the harness's own
loop, and the writing of `/out/trace.jsonl` and `/out/status.json`. The sandbox container runs
`mass sandbox-serve --socket SOCKET --workspace DIR` as another uid: it owns the workspace, and
everything that runs model-written code runs there at the harness's request: the built-in
harness's workspace tools (files, `shell`), and qwen-code, which starts its own shells. The two
share only a Unix socket in an emptyDir and the pod's loopback; the sandbox cannot see `/out`, the
harness's processes (no shared PID namespace) or the proxy's token, so whatever the agent's code
does, the trace and the status are the harness's. (Under seccomp RuntimeDefault the sandbox
cannot unshare namespaces, so a second uid in a second container is the boundary.)

The service speaks HTTP over the socket. It needs no authentication: it runs as the sandbox's uid,
so a caller gets nothing the agent's code does not already have. In the pod (`reap`) it is the
subreaper of everything it starts and kills whatever a shell command or check left running once
it returns, as the local sandbox's namespaces do: nothing the model started outlives its call to
tamper with the next one. Whatever it answers is treated as the agent's own output: bounded and
checked on the harness side; a sandbox that stops answering ends the episode as infra_error and
fails the remaining checks, never passes them.

    PUT  /workspace          a put_dir archive -> the workspace (once, before the first tool)
    GET  /workspace          the workspace as a put_dir archive
    POST /egress             {url}: the run's egress proxy for shell commands (an agent pod's, once)
    POST /tool               {name, args, limits, timeout_s} -> {text, network_isolated} | {tool_error}
    POST /check              {check, limits, protected} -> {exit_code, detail} (a guard check, mass_jobs/sandbox/check_job.py)
    POST /qwen               {episode, proxy: {base_url, model, key}} -> {id}
    GET  /qwen/ID            {returncode, stdout, stderr} (outputs once exited)
    POST /qwen/ID/kill       kill qwen-code's process group
    GET  /health             ready
"""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from mass_jobs.config.errors import SandboxError  # noqa: F401 (raised by SandboxClient; callers import it here too)
from mass_jobs.config.run_spec import EpisodeLimits
from mass_jobs.config.task_spec import CheckCommand
from mass_jobs.episodes import tools as T
from mass_jobs.episodes.episode import episode_input
from mass_jobs.episodes.qwen_code import QwenRun, sandbox_home
from mass_jobs.episodes.qwen_shell import run_shell
from mass_jobs.episodes.sandbox_client import ARCHIVE_LIMIT, REQUEST_LIMIT
from mass_jobs.sandbox.check_job import fresh_copy, run_check
from mass_jobs.sandbox.tree import tree_pids
from mass_jobs.serving.llm import Endpoint
from mass_jobs.store.archive import extract_dir_archive, write_dir_archive

PR_SET_CHILD_SUBREAPER = 36
REAP_ROUNDS = 50  # walks of the tree after a command, until one finds no stray left
KEEP_SOCKET_S = 0.2  # how often a service checks that its socket file is still its own


# ---------------------------------------------------------------- the service (sandbox container)


class SandboxService:
    """The sandbox side: its own workspace, the tools run in it, qwen-code runs started in it."""

    def __init__(
        self,
        workspace: Path,
        reap: bool = False,
        shell_socket: Path | None = None,
        routes: frozenset[str] | None = None,
        limits: EpisodeLimits | None = None,
        egress: str | None = None,
    ):
        self.workspace = Path(workspace)
        self.server: Any = None
        self.reap = reap  # only in its own process (the pod's sidecar): it kills its whole subtree
        self.shell_socket = shell_socket  # where qwen-code's shell commands go (None: this service)
        self.routes = routes  # None: every route; else only these (a shell-only service)
        self.limits = limits  # a shell-only service's episode limits (else each request's)
        self.egress = egress  # the episode's egress proxy socket for shell commands (None: no network)
        self.socket_path: Path | None = None
        self._runs: dict[str, Any] = {}
        self._shells = 0  # shell commands in flight: strays are reaped when none is
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def put_workspace(self, archive: bytes) -> None:

        if self.workspace.exists() and any(self.workspace.iterdir()):
            raise ValueError("the workspace is seeded once per episode")
        extract_dir_archive(io.BytesIO(archive), self.workspace)
        _group_writable(self.workspace)  # an agent pod's qwen-code container works on it too

    def get_workspace(self) -> bytes:

        buf = io.BytesIO()
        write_dir_archive(self.workspace, buf)
        return buf.getvalue()

    def set_egress(self, url: object) -> None:
        """The run's egress proxy for the shell commands here (an agent pod's: the harness names it
        once per episode). Only an http:// URL: a local proxy's socket is this service's from the start."""
        if not isinstance(url, str) or not url.startswith("http://") or self.egress is not None:
            raise ValueError("egress: expected the run's proxy as an http:// URL, once")
        self.egress = url

    def tool(self, body: dict) -> dict:

        limits = EpisodeLimits.model_validate(body["limits"])
        try:
            out = T.run_workspace_tool(
                self.workspace, str(body["name"]), body["args"], limits, float(body["timeout_s"]), self.egress
            )
        except T.ToolError as exc:
            return {"tool_error": str(exc)}
        finally:
            self._reap_strays()
        return {"text": out.text, "network_isolated": out.network_isolated, "memory_limit": out.memory_limit}

    def shell(self, body: dict) -> dict:
        """A qwen-code shell command (its forwarding `bash`, mass_jobs/episodes/qwen_shell.py) under
        the episode's limits: a shell-only service's own, else a qwen-code run's here, else those
        the forwarder names (an agent pod's sandbox, whose qwen-code runs in another container)."""
        from pydantic import ValidationError

        limits = self.limits or next((run.limits for run in self._runs.values()), None)
        if limits is None:
            try:
                limits = EpisodeLimits.model_validate(body.get("limits"))
            except ValidationError as exc:
                return {
                    "exit_code": 126,
                    "stdout": "",
                    "stderr": f"bash: the request's limits are invalid: {exc}\n"[:2000],
                }
        with self._lock:
            self._shells += 1
        try:
            return run_shell(self.workspace, body.get("command"), body.get("cwd"), limits, self.egress)
        finally:
            with self._lock:
                self._shells -= 1
                idle = self._shells == 0
            if idle:  # a command running beside this one keeps its processes
                self._reap_strays()

    def check(self, body: dict) -> dict:

        check = CheckCommand.model_validate(body["check"])
        self._reap_strays()
        try:
            with fresh_copy(self.workspace) as copy:  # what a check writes, the next one never sees
                protected = [str(p) for p in body.get("protected") or [] if isinstance(p, str)]
                code, detail = run_check(check, copy, EpisodeLimits.model_validate(body["limits"]), protected)
        finally:
            self._reap_strays()
        return {"exit_code": code, "detail": detail}

    def _reap_strays(self) -> None:
        """Kill every process below this one that is not a qwen-code run's own (a command's daemons
        were reparented here). qwen-code's shell commands run under this service, not under
        qwen-code, so nothing they leave survives their return either."""
        if not self.reap:
            return

        me = os.getpid()
        for _ in range(REAP_ROUNDS):  # again until a walk finds none: a stray may fork while it is walked
            keep = {pid for run in self._runs.values() if run.poll() is None for pid in tree_pids(run.proc.pid)}
            strays = [pid for pid in reversed(tree_pids(me)) if pid != me and pid not in keep and not _zombie(pid)]
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)
        keep = {pid for run in self._runs.values() for pid in tree_pids(run.proc.pid)}
        for pid in tree_pids(me):  # their zombies are ours to collect now; a qwen-code run's exit is its own
            if pid != me and pid not in keep:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def start_qwen(self, body: dict) -> dict:

        inp = episode_input(body["episode"])
        p = body["proxy"]
        run = QwenRun(
            inp,
            Endpoint(p["base_url"], p["model"], key=p.get("key")),
            self.workspace,
            shell_socket=self.shell_socket or self.socket_path,
            home=sandbox_home(self.workspace),
        )
        run.limits = inp.limits
        with self._lock:
            run_id = str(next(self._ids))
            self._runs[run_id] = run
        return {"id": run_id}

    def qwen(self, run_id: str) -> dict:
        run = self._runs[run_id]
        code = run.poll()
        stdout, stderr = run.output() if code is not None else ("", "")
        return {"returncode": code, "stdout": stdout, "stderr": stderr}

    def kill_qwen(self, run_id: str) -> None:
        self._runs[run_id].kill()


def _zombie(pid: int) -> bool:
    """Already dead, waiting to be collected (nothing left to kill)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _group_writable(root: Path) -> None:
    """g+w on everything under `root` (links untouched), g+s on its folders: in an agent pod the
    sandbox and qwen-code containers share the pod's fsGroup and both change the workspace."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod((mode | 0o020 | (0o2000 if path.is_dir() else 0)) & 0o7777)


class ServiceServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class ServiceHandler(BaseHTTPRequestHandler):
    server: ServiceServer
    protocol_version = "HTTP/1.1"

    def address_string(self) -> str:  # a Unix socket peer has no address
        return "sandbox-client"

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes | dict, kind: str = "application/json") -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self, limit: int) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n > limit:
            raise ValueError(f"request body of {n} bytes is over {limit}")
        return self.rfile.read(n)

    def _route(self, method: str) -> None:
        svc: SandboxService = self.server.service
        parts = [p for p in self.path.split("?", 1)[0].split("/") if p]
        if svc.routes is not None and (parts[:1] or [""])[0] not in svc.routes:
            return self._reply(404, {"error": f"no route {method} {self.path}"})
        try:
            if method == "GET" and parts == ["health"]:
                return self._reply(200, {"ok": True})
            if method == "POST" and parts == ["shutdown"]:  # the end of the episode (a pod's sidecar is killed instead)
                threading.Thread(target=self.server.shutdown, daemon=True).start()
                return self._reply(200, {"ok": True})
            if parts == ["workspace"] and method == "PUT":
                svc.put_workspace(self._body(ARCHIVE_LIMIT))
                return self._reply(200, {"ok": True})
            if parts == ["workspace"] and method == "GET":
                return self._reply(200, svc.get_workspace(), "application/gzip")
            if parts == ["egress"] and method == "POST":
                svc.set_egress(json.loads(self._body(REQUEST_LIMIT)).get("url"))
                return self._reply(200, {"ok": True})
            if parts == ["tool"] and method == "POST":
                return self._reply(200, svc.tool(json.loads(self._body(REQUEST_LIMIT))))
            if parts == ["shell"] and method == "POST":
                return self._reply(200, svc.shell(json.loads(self._body(REQUEST_LIMIT))))
            if parts == ["check"] and method == "POST":
                return self._reply(200, svc.check(json.loads(self._body(REQUEST_LIMIT))))
            if parts == ["qwen"] and method == "POST":
                return self._reply(200, svc.start_qwen(json.loads(self._body(REQUEST_LIMIT))))
            if len(parts) == 2 and parts[0] == "qwen" and method == "GET":
                return self._reply(200, svc.qwen(parts[1]))
            if len(parts) == 3 and parts[0] == "qwen" and parts[2] == "kill" and method == "POST":
                svc.kill_qwen(parts[1])
                return self._reply(200, {"ok": True})
            return self._reply(404, {"error": f"no route {method} {self.path}"})
        except KeyError as exc:
            return self._reply(404, {"error": f"unknown {exc}"})
        except Exception as exc:  # reported to the harness, which ends the episode as infra_error
            return self._reply(500, {"error": f"{type(exc).__name__}: {exc}"[:4000]})

    def do_GET(self) -> None:
        self._route("GET")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_POST(self) -> None:
        self._route("POST")


def serve(
    socket_path: Path,
    workspace: Path,
    ready=None,
    reap: bool = False,
    shell_socket: Path | None = None,
    routes: frozenset[str] | None = None,
) -> None:
    """Serve until killed (Argo ends a sidecar when the main container exits). The socket is made
    connectable by the harness's uid; the workspace is this uid's own. With `reap` this process
    becomes the subreaper of all it starts (see the module docstring). `shell_socket`: a shell-only
    service elsewhere that runs qwen-code's shell commands (one machine: the harness's, whose
    commands get namespaces of their own); else this service runs them."""
    socket_path = Path(socket_path)
    socket_path.unlink(missing_ok=True)
    if reap:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    server = ServiceServer(str(socket_path), ServiceHandler)
    os.chmod(socket_path, 0o666)
    server.service = SandboxService(workspace, reap=reap, shell_socket=shell_socket, routes=routes)
    server.service.server = server
    server.service.socket_path = socket_path
    if ready is not None:
        ready(server)
    threading.Thread(target=_keep_socket, args=(server, socket_path), daemon=True).start()
    with server:
        server.serve_forever(poll_interval=0.2)


def _keep_socket(server: ServiceServer, path: Path) -> None:
    """Bind the socket again whenever its file is gone or replaced: in a pod the agent's code runs
    as this service's uid in a folder it may write, and removing the socket must not cut the
    harness off (its clients retry a connect for a few seconds). Ends with the process."""

    def inode() -> int | None:
        try:
            return os.lstat(path).st_ino
        except OSError:
            return None

    bound = inode()
    while True:
        time.sleep(KEEP_SOCKET_S)
        if inode() == bound:
            continue
        try:
            path.unlink(missing_ok=True)
            again = ServiceServer(str(path), ServiceHandler)
        except OSError:
            continue
        os.chmod(path, 0o666)
        again.service = server.service
        threading.Thread(target=again.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        bound = inode()
