"""Tools of the built-in harness: OpenAI function definitions and their implementations.

File tools are confined to the workspace (`resolve_in_workspace` rejects `../` and symlink
escapes); the shell tool runs through `run_sandboxed` (scrubbed env, rlimits, timeout). Every tool
returns text that goes back to the model, truncated to a bounded size. A tool error is returned to
the model as text starting with `ERROR:` (the audit relies on that prefix), never raised further:
whatever the model passes (a file used as a folder, over-long or deep paths, symlink loops, lone
surrogates, a FIFO, a huge file) ends as a tool error, and no file tool can block (files are opened
non-blocking, regular files only) or exhaust the harness (bounded reads, iterative listing).
Used by `mass_jobs.episodes.builtin`; run an episode with `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import EpisodeLimits
from mass_jobs.sandbox.run import SandboxEscape, SandboxLimits, resolve_in_workspace, run_sandboxed
from mass_jobs.sandbox.tree import workspace_usage

TOOL_OUTPUT_CHARS = 16_000  # what one tool result may put into the context
LIST_MAX_ENTRIES = 500
ERROR_PREFIX = "ERROR:"


class ToolError(Exception):
    """A tool call the model got wrong (bad arguments, escape, missing file): reported back to it."""


def truncate(text: str, limit: int = TOOL_OUTPUT_CHARS) -> str:
    """Keep head and tail so both a command's start and its final error stay visible."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters truncated ...]\n{text[-tail:]}"


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_STR = {"type": "string"}

READ_FILE = _function(
    "read_file",
    "Read a text file of the workspace.",
    {"path": {**_STR, "description": "Workspace-relative path."}},
    ["path"],
)
WRITE_FILE = _function(
    "write_file",
    "Create or overwrite a text file of the workspace (parent folders are created).",
    {"path": {**_STR, "description": "Workspace-relative path."}, "content": {**_STR, "description": "Full text."}},
    ["path", "content"],
)
LIST_FILES = _function(
    "list_files",
    "List files under a workspace folder, recursively, with sizes in bytes.",
    {"path": {**_STR, "description": "Workspace-relative folder; '.' for the root."}},
    [],
)
SHELL = _function(
    "shell",
    "Run a shell command (bash) in the workspace root. No network, no secrets, limited CPU/memory/time.",
    {"command": {**_STR, "description": "The command line."}},
    ["command"],
)
DELEGATE = _function(
    "delegate",
    "Give a self-contained assignment to a worker agent (the same model, fresh context, with file and shell "
    "tools). Blocks until the worker finishes and returns its final report.",
    {
        "agent_id": {**_STR, "description": "Short id of the worker, e.g. 'worker-1' or 'data-engineer'."},
        "role": {**_STR, "description": "The worker's role, e.g. 'data engineer'."},
        "assignment": {
            **_STR,
            "description": "Everything the worker needs: goal, inputs (files), outputs (files) and checks.",
        },
    },
    ["assignment"],
)
FINISH = _function(
    "finish",
    "End your work and hand back a final report.",
    {
        "summary": {**_STR, "description": "What was done, where the outputs are, what failed."},
        "status": {"type": "string", "enum": ["success", "failure"], "description": "Did the work succeed?"},
    },
    ["summary"],
)


def tool_name(spec: dict[str, Any]) -> str:
    return spec["function"]["name"]


def require_str(args: dict[str, Any], key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if value is None:
        raise ToolError(f"missing required argument {key!r}")
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string, got {type(value).__name__}")
    return value


MAX_PATH_CHARS = 1024  # a workspace path the model names; deeper or longer is refused up front
MAX_PATH_PARTS = 64
MAX_NAME_BYTES = 255  # one component (NAME_MAX)
READ_MAX_BYTES = 256 * 1024  # read_file reads at most this much (head and tail of a larger file)
COMMAND_MAX_BYTES = 64 * 1024  # longer commands go in a script file (and would pass exec's limits)
LIST_MAX_VISITS = 20_000  # entries list_files looks at before it stops


def _utf8(value: str, key: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(f"argument {key!r} is not valid Unicode text ({exc.reason} at index {exc.start})") from None


def _check_path(relpath: str) -> None:
    _utf8(relpath, "path")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if len(relpath) > MAX_PATH_CHARS or len(parts) > MAX_PATH_PARTS:
        raise ToolError(f"path is too long: at most {MAX_PATH_CHARS} characters and {MAX_PATH_PARTS} folders deep")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise ToolError(f"a name in the path is over {MAX_NAME_BYTES} bytes: {part[:40]!r}...")


def _resolve(workspace: Path, relpath: str) -> Path:

    _check_path(relpath)
    try:
        return resolve_in_workspace(workspace, relpath)
    except SandboxEscape as exc:
        raise ToolError(f"path {relpath!r} is outside the workspace: {exc}") from None
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise ToolError(f"path {relpath!r} cannot be resolved: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """What went wrong, without the host's absolute paths."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).split(": '/")[0]


def model_input(fn):
    """A file tool whose filesystem errors come from the model's arguments: each is a ToolError."""
    import functools

    @functools.wraps(fn)
    def wrapped(workspace: Path, args: dict[str, Any], *rest: Any) -> str:
        try:
            return fn(workspace, args, *rest)
        except ToolError:
            raise
        except (OSError, ValueError, RuntimeError, RecursionError) as exc:
            where = args.get("path") if isinstance(args.get("path"), str) else "."
            raise ToolError(f"{fn.__name__} on {where!r} failed: {_reason(exc)}") from None

    return wrapped


def _open_regular(path: Path, flags: int, relpath: str) -> int:
    """An fd of the regular file `path`; a FIFO, device or socket is refused before it can block."""
    import stat

    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{relpath!r} is not a regular file")
    return fd


@model_input
def read_file(workspace: Path, args: dict[str, Any]) -> str:
    relpath = require_str(args, "path")
    path = _resolve(workspace, relpath)
    if not path.exists() or path.is_dir():
        raise ToolError(f"no such file: {relpath!r}")
    try:
        fd = _open_regular(path, os.O_RDONLY, relpath)
    except OSError as exc:
        raise ToolError(f"{relpath!r} cannot be read: {_reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size <= READ_MAX_BYTES:
            data = f.read(READ_MAX_BYTES)
        else:  # head and tail only: a huge file must not fill the harness's memory
            head = f.read(READ_MAX_BYTES // 2)
            f.seek(size - READ_MAX_BYTES // 2)
            text = head.decode("utf-8", "replace") + "\n[... middle of the file skipped ...]\n"
            return truncate(text + f.read().decode("utf-8", "replace"))
    try:
        return truncate(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ToolError(f"{relpath!r} is not UTF-8 text ({len(data)} bytes)") from None


@model_input
def write_file(workspace: Path, args: dict[str, Any], max_bytes: int) -> str:
    relpath = require_str(args, "path")
    content = require_str(args, "content")
    data = _utf8(content, "content")
    if len(data) > max_bytes:
        raise ToolError(f"content of {relpath!r} is {len(data)} bytes, over the {max_bytes}-byte file limit")
    path = _resolve(workspace, relpath)
    if path.is_dir():
        raise ToolError(f"{relpath!r} is a folder")
    _check_quota(workspace, len(data))
    os.makedirs(path.parent, exist_ok=True)
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, relpath)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return f"wrote {len(data)} bytes to {relpath}"


def _check_quota(workspace: Path, adding: int) -> None:

    q = SandboxLimits()
    size, files = workspace_usage(workspace)
    if files >= q.workspace_files or size + adding > q.workspace_mb * 1024 * 1024:
        raise ToolError(
            f"workspace quota reached ({q.workspace_mb} MB, {q.workspace_files} entries): delete files first"
        )


@model_input
def list_files(workspace: Path, args: dict[str, Any]) -> str:
    relpath = require_str(args, "path", ".") or "."
    root = _resolve(workspace, relpath)
    if not root.is_dir():
        raise ToolError(f"no such folder: {relpath!r}")
    base = str(workspace.resolve())
    found: list[tuple[str, int]] = []
    todo, visits = [str(root)], 0
    while todo and visits < LIST_MAX_VISITS:  # iterative: a deep tree cannot exhaust the stack
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            visits += 1
            if e.is_dir(follow_symlinks=False):
                todo.append(e.path)
            elif e.is_file(follow_symlinks=False):  # symlinks may point outside: left out
                found.append((os.path.relpath(e.path, base), e.stat(follow_symlinks=False).st_size))
    found.sort(key=lambda item: item[0].split("/"))
    lines = [f"{p}\t{size}" for p, size in found[:LIST_MAX_ENTRIES]]
    if len(found) > LIST_MAX_ENTRIES or visits >= LIST_MAX_VISITS:
        lines.append(f"[... listing stopped at {min(len(found), LIST_MAX_ENTRIES)} files ...]")
    return "\n".join(lines) if lines else "(no files)"


@dataclass
class ShellOutcome:
    text: str
    ok: bool
    network_isolated: bool
    memory_limit: str = "sampled"  # what held its memory (sandbox.SandboxResult.memory_limit)


def shell(
    workspace: Path, args: dict[str, Any], limits: EpisodeLimits, timeout_s: float, egress: str | None = None
) -> ShellOutcome:

    command = require_str(args, "command")
    if not command.strip():
        raise ToolError("argument 'command' is empty")
    if "\x00" in command:
        raise ToolError("argument 'command' contains a NUL byte")
    if len(_utf8(command, "command")) > COMMAND_MAX_BYTES:
        raise ToolError(f"command is over {COMMAND_MAX_BYTES} bytes: write it to a script file and run that")
    result = run_sandboxed(command, workspace, sandbox_limits(limits, timeout_s, egress))
    parts = [f"exit_code: {result.exit_code}"]
    if result.timed_out or result.killed_reason:
        parts.append(f"killed: {result.killed_reason or 'timeout'}")
        if result.note:
            parts.append(f"note: {result.note}")
    parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    ok = result.exit_code == 0 and not result.timed_out and not result.killed_reason
    text = "\n".join(parts)
    return ShellOutcome(
        text=truncate(text if ok else f"{ERROR_PREFIX} command failed\n{text}"),
        ok=ok,
        network_isolated=bool(result.network_isolated),
        memory_limit=result.memory_limit,
    )


def sandbox_limits(limits: EpisodeLimits, timeout_s: float, egress: str | None = None):
    """The episode's per-command limits, with the timeout cut to what is left of the wall time; with
    `egress` (the episode's egress proxy socket) the command's only way out is that proxy. An
    `http://` egress is the run's proxy on a cluster, where the pod's NetworkPolicy holds the command."""

    if egress is not None and egress.startswith("http://"):
        return SandboxLimits.from_episode_limits(limits, timeout_s=timeout_s, egress_url=egress, isolate_network=False)
    return SandboxLimits.from_episode_limits(limits, timeout_s=timeout_s, egress_socket=egress)


WORKSPACE_TOOLS = ("read_file", "write_file", "list_files", "shell")  # the tools that touch the workspace


@dataclass
class ToolRun:
    """What a workspace tool gives back: the text for the model; for `shell`, whether its network was isolated."""

    text: str
    network_isolated: bool | None = None
    memory_limit: str | None = None  # for `shell`: "cgroup v1" / "cgroup v2" (the kernel) or "sampled"


def run_workspace_tool(
    workspace: Path, name: str, args: dict[str, Any], limits: EpisodeLimits, timeout_s: float, egress: str | None = None
) -> ToolRun:
    """One call of a WORKSPACE_TOOLS tool in `workspace`, wherever that lives: in the harness's own
    process locally, in an agent pod's sandbox container (`mass_jobs.episodes.sandbox_service`) on a cluster.
    A mistake of the model's raises ToolError."""
    if name == "read_file":
        return ToolRun(read_file(workspace, args))
    if name == "write_file":
        return ToolRun(write_file(workspace, args, limits.file_size_mb * 1024 * 1024))
    if name == "list_files":
        return ToolRun(list_files(workspace, args))
    if name == "shell":
        out = shell(workspace, args, limits, timeout_s, egress)
        return ToolRun(out.text, out.network_isolated, out.memory_limit)
    raise ToolError(f"tool {name!r} is not a workspace tool")
