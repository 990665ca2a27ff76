"""qwen-code's shell commands, run where model-written code may run and nowhere else.

qwen-code runs every shell command as `bash -c COMMAND`, a child of its own process that inherits
its environment, which holds the recording proxy's token. The harness puts a `bash` of its own
first on qwen-code's PATH: a stdlib-only forwarder (`SHIM`) that hands the command and its folder to
a sandbox service over a Unix socket and prints what comes back. The command then runs as the
built-in harness's `shell` tool runs one (`run_sandboxed`: a scrubbed environment, the workspace its
only writable folder, rlimits and tree limits): on one machine in namespaces of its own with no
network, in an agent pod in the sandbox container, another uid and PID namespace than qwen-code.
Never in qwen-code's process tree: nothing a command starts can read qwen-code's environment, its
HOME, its output pipes or the proxy, and it is killed when the command returns.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mass_jobs.episodes.tools import COMMAND_MAX_BYTES, sandbox_limits
from mass_jobs.sandbox.run import SandboxEscape, resolve_in_workspace, run_sandboxed

if TYPE_CHECKING:
    from mass_jobs.config.run_spec import EpisodeLimits

SHIM_NAME = "bash"
# The forwarder. `-I`: no environment variable or user site changes what it runs.
SHIM = r"""#!{python} -I
# qwen-code's `bash`: hands `bash -c COMMAND` to the episode's sandbox (mass_jobs/episodes/qwen_shell.py).
import http.client, json, os, socket, sys, time

SOCKET = {socket!r}
LIMITS = {limits!r}  # the episode's, for a sandbox that serves no episode of its own (an agent pod's)


class Connection(http.client.HTTPConnection):
    def connect(self):
        for attempt in range(100):  # a removed socket is bound again within a fraction of a second
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                return self.sock.connect(SOCKET)
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if attempt == 99:
                    raise
                time.sleep(0.1)


args = sys.argv[1:]
if len(args) < 2 or args[0] != "-c":
    sys.stderr.write("bash: only `bash -c COMMAND` runs here: commands run in the episode's sandbox\n")
    sys.exit(127)
body = json.dumps({{"command": args[1], "cwd": os.getcwd(), "limits": json.loads(LIMITS)}}).encode()
try:
    conn = Connection("sandbox", timeout=None)
    conn.request("POST", "/shell", body=body, headers={{"Content-Type": "application/json"}})
    resp = conn.getresponse()
    reply = json.loads(resp.read({reply_limit}))
    if resp.status != 200 or not isinstance(reply, dict):
        raise RuntimeError(f"HTTP {{resp.status}}: {{reply}}")
except Exception as exc:
    sys.stderr.write(f"bash: the sandbox did not run the command: {{exc}}\n")
    sys.exit(126)
sys.stdout.buffer.write(str(reply.get("stdout", "")).encode("utf-8", "replace"))
sys.stderr.buffer.write(str(reply.get("stderr", "")).encode("utf-8", "replace"))
code = reply.get("exit_code")
sys.exit(code if isinstance(code, int) and 0 <= code < 256 else 128 + (-code if isinstance(code, int) and code < 0 else 1))
"""
REPLY_LIMIT = 8 << 20  # two streams of run_sandboxed's 1 MB each, JSON-escaped, with room to spare


def install_shim(bin_dir: Path, socket_path: str | Path, limits: EpisodeLimits) -> Path:
    """Write the forwarder as `bin_dir/bash` (to go first on qwen-code's PATH) for `socket_path`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / SHIM_NAME
    path.write_text(
        SHIM.format(
            python=sys.executable, socket=str(socket_path), reply_limit=REPLY_LIMIT, limits=limits.model_dump_json()
        )
    )
    path.chmod(0o555)
    return path


def run_shell(workspace: Path, command: object, cwd: object, limits: EpisodeLimits, egress: str | None = None) -> dict:
    """What `POST /shell` answers: the command run by bash in `cwd` (a folder of the workspace) under
    the episode's shell limits; {exit_code, stdout, stderr, network_isolated}. A folder outside the
    workspace or a malformed request is the command's failure (exit 126), never the service's."""

    root = Path(workspace).resolve()
    if not isinstance(command, str) or not command.strip() or "\x00" in command:
        return _refused("the command must be a non-empty string without NUL bytes")
    if len(command.encode("utf-8", "surrogatepass")) > COMMAND_MAX_BYTES:
        return _refused(f"the command is over {COMMAND_MAX_BYTES} bytes: write it to a script file and run that")
    rel = "."
    if isinstance(cwd, str) and cwd and os.path.abspath(cwd) != str(root):
        rel = os.path.relpath(os.path.abspath(cwd), root)
        try:
            resolve_in_workspace(root, rel)
        except SandboxEscape as exc:
            return _refused(f"the working folder is outside the workspace: {exc}")
    script = f"cd -- {shlex.quote(rel)} && exec bash -c {shlex.quote(command)}"
    result = run_sandboxed(script, root, sandbox_limits(limits, limits.shell_timeout_s, egress))
    stderr = result.stderr
    if result.timed_out or result.killed_reason:
        stderr += f"\n[killed: {result.killed_reason or 'timeout'}]"
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": stderr,
        "network_isolated": bool(result.network_isolated),
    }


def _refused(why: str) -> dict:
    return {"exit_code": 126, "stdout": "", "stderr": f"bash: {why}\n", "network_isolated": True}
