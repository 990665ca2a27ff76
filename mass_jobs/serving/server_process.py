"""A model server as a child process: start it, wait until `/health` answers 200, stop it cleanly.

Shared by every backend that runs a server here (`mass serve`, `vllm serve`): the command runs in
its own process group through a lifeline (a SIGKILLed caller takes it along), and `stop()` sends
SIGTERM to the whole group, then SIGKILL after a grace period, so no worker process outlives it.

    with ServerProcess(cmd, port=port, name="vllm") as srv:
        httpx.get(f"{srv.base_url}/v1/models")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from mass_jobs.sandbox import lifeline


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`command` (a list, listening on host:port) as a child process for the duration of a `with` block."""

    def __init__(
        self,
        command: list[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        name: str = "model server",
        startup_timeout_s: float = 180.0,
        log_path: str | os.PathLike | None = None,
        stop_grace_s: float = 10.0,
    ):
        self._command = command
        self.host, self.port, self.name = host, port, name
        self.startup_timeout_s, self.stop_grace_s = startup_timeout_s, stop_grace_s
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        """The argv to run; subclasses build it from their settings once the port is known."""
        assert self._command is not None, "ServerProcess needs a command"
        return self._command

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self):
        import httpx

        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="mass-serve-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with open(self.log_path, "ab") as log:
            # Own process group: stop() ends the server and every worker it forked together.
            self.process = lifeline.spawn(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"{self.name} exited with code {code} before it was healthy:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"{self.name} not healthy after {self.startup_timeout_s:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL to it after `stop_grace_s`; returns once the leader is reaped."""
        proc, self.process = self.process, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
        # Workers that ignored SIGTERM while the leader exited still hold the group: end them too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def log_tail(self, n_bytes: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
