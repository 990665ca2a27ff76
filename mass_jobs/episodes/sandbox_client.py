"""The harness container's side of the sandbox split (`sandbox_service`): an HTTP client over the
sandbox's Unix socket that hands it the workspace, tool calls, check commands and qwen-code runs,
and takes the workspace back. It holds no credential the sandbox could use and reads every reply
within a size limit."""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mass_jobs.config.errors import SandboxError
from mass_jobs.episodes.episode import episode_file_json
from mass_jobs.episodes.tools import ToolError, ToolRun, truncate
from mass_jobs.sandbox.check_job import DETAIL_CHARS
from mass_jobs.sandbox.run import MEMORY_LIMITS
from mass_jobs.store.archive import UnsafeArchive, extract_dir_archive, write_dir_archive

if TYPE_CHECKING:
    from mass_jobs.config.run_spec import EpisodeLimits
    from mass_jobs.episodes.episode import EpisodeInput
    from mass_jobs.serving.llm import Endpoint

REQUEST_LIMIT = 64 << 20  # a tool call or qwen request: far below; a workspace archive: see ARCHIVE_LIMIT
ARCHIVE_LIMIT = 1 << 30  # compressed workspace archive either way
REPLY_LIMIT = 64 << 20  # what the harness reads back from the sandbox for anything but the archive
CONNECT_RETRY_S = 10.0  # how long a client retries a connect to a socket being bound again (a loaded node)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float, connect_retry_s: float = CONNECT_RETRY_S):
        super().__init__("sandbox", timeout=timeout)
        self._path, self._connect_retry_s = path, connect_retry_s

    def connect(self) -> None:
        deadline = time.monotonic() + self._connect_retry_s
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            try:
                self.sock.connect(self._path)
                return
            except (FileNotFoundError, ConnectionRefusedError):  # removed, and being bound again
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class SandboxClient:
    """The harness's handle on the sandbox container. Every reply is bounded and checked: the
    service runs where the agent's code does, so what comes back is treated as the agent's."""

    def __init__(
        self, socket_path: str | Path, timeout_s: float = 120.0, ready_s: float = 120.0, shares_workspace: bool = False
    ):
        self.path = str(socket_path)
        self.timeout_s = timeout_s  # one reply (a tool call gets its own timeout on top)
        self.ready_s = ready_s  # how long the sandbox container may take to come up
        self.shares_workspace = shares_workspace  # works in the harness's workspace folder: nothing to hand over

    def _call(
        self,
        method: str,
        route: str,
        body: bytes = b"",
        timeout_s: float | None = None,
        limit: int = REPLY_LIMIT,
        connect_retry_s: float = CONNECT_RETRY_S,
    ) -> tuple[int, bytes]:
        conn = _UnixConnection(self.path, timeout_s or self.timeout_s, connect_retry_s)
        try:
            conn.request(method, route, body=body, headers={"Content-Length": str(len(body))})
            resp = conn.getresponse()
            data = resp.read(limit + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise SandboxError(f"sandbox at {self.path}: {method} {route}: {exc}") from None
        finally:
            conn.close()
        if len(data) > limit:
            raise SandboxError(f"sandbox at {self.path}: {method} {route}: reply over {limit} bytes")
        return resp.status, data

    def _json(
        self,
        method: str,
        route: str,
        doc: dict | None = None,
        timeout_s: float | None = None,
        connect_retry_s: float = CONNECT_RETRY_S,
    ) -> dict:
        status, data = self._call(
            method,
            route,
            json.dumps(doc).encode() if doc is not None else b"",
            timeout_s,
            connect_retry_s=connect_retry_s,
        )
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise SandboxError(f"sandbox: {method} {route}: HTTP {status}, not a JSON object")
        if status != 200:
            raise SandboxError(f"sandbox: {method} {route}: HTTP {status}: {str(reply.get('error'))[:2000]}")
        return reply

    def wait_ready(self) -> SandboxClient:
        """Until the sandbox container answers (the two containers start in either order)."""
        timeout_s = self.ready_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:  # this loop is the retry: a connect may not outwait ready_s on its own
                self._json(
                    "GET",
                    "/health",
                    timeout_s=5,
                    connect_retry_s=max(0.0, min(CONNECT_RETRY_S, deadline - time.monotonic())),
                )
                return self
            except SandboxError as exc:
                if time.monotonic() > deadline:
                    raise SandboxError(f"the sandbox container did not come up within {timeout_s:g}s ({exc})") from None
                time.sleep(0.2)

    def put_workspace(self, workspace: Path) -> None:

        buf = io.BytesIO()
        write_dir_archive(workspace, buf)
        self._check(*self._call("PUT", "/workspace", buf.getvalue()), "PUT /workspace")

    def get_workspace(self, into: Path) -> None:
        """The sandbox's workspace, extracted (hostile-proof) into the empty or missing `into`."""

        status, data = self._call("GET", "/workspace", limit=ARCHIVE_LIMIT)
        self._check(status, data, "GET /workspace")
        try:
            extract_dir_archive(io.BytesIO(data), into)
        except (UnsafeArchive, EOFError, OSError) as exc:
            raise SandboxError(f"sandbox: the workspace it returned was refused: {exc}") from None

    @staticmethod
    def _check(status: int, data: bytes, what: str) -> None:
        if status != 200:
            raise SandboxError(f"sandbox: {what}: HTTP {status}: {data[:2000].decode('utf-8', 'replace')}")

    def set_egress(self, url: str) -> None:
        """Shell commands there reach out through the run's egress proxy at `url` (with its credentials)."""
        self._json("POST", "/egress", {"url": url})

    def tool(self, name: str, args: dict, limits: EpisodeLimits, timeout_s: float) -> ToolRun:
        """A workspace tool in the sandbox; a ToolError there is a ToolError here."""

        reply = self._json(
            "POST",
            "/tool",
            {"name": name, "args": args, "limits": limits.model_dump(mode="json"), "timeout_s": timeout_s},
            timeout_s=timeout_s + self.timeout_s,
        )
        if "tool_error" in reply:
            raise ToolError(truncate(str(reply["tool_error"])))

        isolated, memory = reply.get("network_isolated"), reply.get("memory_limit")
        return ToolRun(
            truncate(str(reply.get("text", ""))),
            isolated if isinstance(isolated, bool) else None,
            memory if memory in MEMORY_LIMITS else None,
        )

    def check(self, check, limits: EpisodeLimits, protected=()) -> tuple[int, str]:
        """A guard check (CheckCommand) in the sandbox's workspace, `protected` read-only: (exit code, detail)."""

        reply = self._json(
            "POST",
            "/check",
            {
                "check": check.model_dump(mode="json"),
                "limits": limits.model_dump(mode="json"),
                "protected": list(protected),
            },
            timeout_s=check.timeout_s + self.timeout_s,
        )
        code = reply.get("exit_code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise SandboxError(f"sandbox: POST /check: exit_code {code!r} is not an integer")
        return code, str(reply.get("detail", ""))[-DETAIL_CHARS:]

    def start_qwen(self, inp: EpisodeInput, proxy: Endpoint) -> RemoteQwenRun:

        reply = self._json(
            "POST",
            "/qwen",
            {
                "episode": episode_file_json(inp),
                "proxy": {"base_url": proxy.base_url, "model": proxy.model, "key": proxy.key},
            },
        )
        return RemoteQwenRun(self, str(reply.get("id")))


class RemoteQwenRun:
    """qwen-code running in the sandbox container: the QwenRun interface, over the socket."""

    def __init__(self, client: SandboxClient, run_id: str):
        self.client, self.id = client, run_id
        self._last: dict = {}

    def poll(self) -> int | None:
        self._last = self.client._json("GET", f"/qwen/{self.id}")
        code = self._last.get("returncode")
        return code if isinstance(code, int) else None

    def kill(self) -> None:
        self.client._json("POST", f"/qwen/{self.id}/kill")

    def output(self) -> tuple[str, str]:
        if self.poll() is None:
            return "", ""
        return str(self._last.get("stdout", "")), str(self._last.get("stderr", ""))

    def close(self) -> None:
        if self.poll() is None:
            self.kill()
