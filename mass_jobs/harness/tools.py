"""Tools of the built-in harness: OpenAI function definitions and their implementations.

File tools are confined to the workspace (`resolve_in_workspace` rejects `../` and symlink
escapes); the shell tool runs through `run_sandboxed` (scrubbed env, rlimits, timeout). Every tool
returns text that goes back to the model, truncated to a bounded size. A tool error is returned to
the model as text starting with `ERROR:` (the audit relies on that prefix), never raised further.
Used by `mass_jobs.harness.builtin`; run an episode with `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.models import EpisodeLimits

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


def _resolve(workspace: Path, relpath: str) -> Path:
    from mass_jobs.sandbox import SandboxEscape, resolve_in_workspace

    try:
        return resolve_in_workspace(workspace, relpath)
    except SandboxEscape as exc:
        raise ToolError(f"path {relpath!r} is outside the workspace: {exc}") from None


def read_file(workspace: Path, args: dict[str, Any]) -> str:
    relpath = require_str(args, "path")
    path = _resolve(workspace, relpath)
    if not path.is_file():
        raise ToolError(f"no such file: {relpath!r}")
    data = path.read_bytes()
    try:
        return truncate(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ToolError(f"{relpath!r} is not UTF-8 text ({len(data)} bytes)") from None


def write_file(workspace: Path, args: dict[str, Any], max_bytes: int) -> str:
    relpath = require_str(args, "path")
    content = require_str(args, "content")
    data = content.encode("utf-8")
    if len(data) > max_bytes:
        raise ToolError(f"content of {relpath!r} is {len(data)} bytes, over the {max_bytes}-byte file limit")
    path = _resolve(workspace, relpath)
    if path.is_dir():
        raise ToolError(f"{relpath!r} is a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"wrote {len(data)} bytes to {relpath}"


def list_files(workspace: Path, args: dict[str, Any]) -> str:
    relpath = require_str(args, "path", ".") or "."
    root = _resolve(workspace, relpath)
    if not root.is_dir():
        raise ToolError(f"no such folder: {relpath!r}")
    base = workspace.resolve()
    lines: list[str] = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue  # symlinks may point outside; folders are implied by the file paths
        lines.append(f"{path.relative_to(base).as_posix()}\t{path.stat().st_size}")
        if len(lines) >= LIST_MAX_ENTRIES:
            lines.append(f"[... listing stopped at {LIST_MAX_ENTRIES} files ...]")
            break
    return "\n".join(lines) if lines else "(no files)"


@dataclass
class ShellOutcome:
    text: str
    ok: bool
    network_isolated: bool


def shell(workspace: Path, args: dict[str, Any], limits: EpisodeLimits, timeout_s: float) -> ShellOutcome:
    from mass_jobs.sandbox import run_sandboxed

    command = require_str(args, "command")
    if not command.strip():
        raise ToolError("argument 'command' is empty")
    result = run_sandboxed(command, workspace, sandbox_limits(limits, timeout_s))
    parts = [f"exit_code: {result.exit_code}"]
    if result.timed_out or result.killed_reason:
        parts.append(f"killed: {result.killed_reason or 'timeout'}")
    parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    ok = result.exit_code == 0 and not result.timed_out
    text = "\n".join(parts)
    return ShellOutcome(
        text=truncate(text if ok else f"{ERROR_PREFIX} command failed\n{text}"),
        ok=ok,
        network_isolated=bool(result.network_isolated),
    )


def sandbox_limits(limits: EpisodeLimits, timeout_s: float):
    """The episode's per-command limits, with the timeout cut to what is left of the wall time."""
    from mass_jobs.sandbox import SandboxLimits

    return SandboxLimits.from_episode_limits(limits, timeout_s=timeout_s)
