"""Agent episodes: one prompt, one workspace, one model endpoint -> workspace + trace + status.

`run_episode(EpisodeInput(...), workspace, out_dir)` seeds the workspace, starts a RecordingProxy in
front of the endpoint (every model call of the episode lands in `out_dir/trace.jsonl`), runs the
chosen harness (`builtin`: the Python orchestrator/worker runtime; `qwen-code`: the npm CLI) and
writes `out_dir/status.json`, validated against schemas/episode-status.schema.json. It never raises
for what a model or endpoint does: those end as a classified outcome. Run one episode in a pod or
locally with `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs.llm import Endpoint
from mass_jobs.models import Closed, EpisodeLimits, Sampling

OUTCOMES = ("success", "failed", "turn_limit", "loop_detected", "timeout", "infra_error")
HARNESSES = ("builtin", "qwen-code")
# The episode limits (execution.limits) that end an episode, by the outcome each ends it with; the
# tool-call cap ends it "failed" with this reason (both harnesses word it so).
CAPS = ("turns_per_agent", "tool_calls", "wall_s", "loop_repeats")
TOOL_CALL_CAP = "tool-call limit of"


def episode_cap(status: dict) -> str | None:
    """Which cap of execution.limits ended the episode (CAPS), or None when none did."""
    outcome, reason = status.get("outcome"), str(status.get("reason") or "")
    if outcome == "failed" and reason.startswith(TOOL_CALL_CAP):
        return "tool_calls"
    return {"turn_limit": "turns_per_agent", "timeout": "wall_s", "loop_detected": "loop_repeats"}.get(outcome)
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "episode-status.schema.json"


@dataclass
class EpisodeInput:
    prompt: str
    endpoint: Endpoint
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    sampling: Sampling = field(default_factory=Sampling)
    harness: str = "builtin"
    seed: int | None = None
    files: dict[str, str] = field(default_factory=dict)  # seed files: workspace-relative path -> text
    single_agent: bool = False  # one agent with the workers' tools and no delegation tool (builtin only)


@dataclass
class EpisodeResult:
    outcome: str
    reason: str
    status: dict[str, Any]  # the content of status.json
    workspace: Path
    trace_path: Path
    status_path: Path
    final_report: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


@dataclass
class HarnessOutcome:
    """What a harness hands back to `run_episode`, which adds timings and writes status.json."""

    outcome: str
    reason: str
    counts: dict[str, int]
    tokens: dict[str, int]
    network_isolated: bool
    sandbox_note: str
    final_report: str = ""
    memory_limit: str | None = None  # what held the shell commands' memory, when any ran


class EpisodeEndpointFile(Closed):
    base_url: str = Field(min_length=1, description="OpenAI-compatible API root, e.g. http://host:8000/v1.")
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class EpisodeFile(Closed):
    """`episode.json` of `mass episode --in DIR` (what an agent pod receives besides DIR/workspace/)."""

    prompt: str = Field(min_length=1)
    endpoint: EpisodeEndpointFile
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    sampling: Sampling = Field(default_factory=Sampling)
    harness: Literal["builtin", "qwen-code"] = "builtin"
    seed: int | None = None
    files: dict[str, str] = Field(default_factory=dict)
    single_agent: bool = Field(default=False, description="One agent, no delegation tool (builtin harness).")


def load_episode_file(path: Path) -> EpisodeInput:
    """Parse and validate episode.json; ValueError names each bad field."""
    from pydantic import ValidationError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read episode JSON: {exc}") from None
    try:
        return episode_input(data)
    except ValidationError as exc:
        lines = [f"$.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ValueError(f"{path}: invalid episode file:\n" + "\n".join(lines)) from None


def episode_input(data: Any) -> EpisodeInput:
    """An episode.json document as an EpisodeInput (pydantic's ValidationError when it is not one)."""
    f = EpisodeFile.model_validate(data)
    return EpisodeInput(
        prompt=f.prompt,
        endpoint=Endpoint(f.endpoint.base_url, f.endpoint.model, f.endpoint.api_key_env),
        limits=f.limits,
        sampling=f.sampling,
        harness=f.harness,
        seed=f.seed,
        files=dict(f.files),
        single_agent=f.single_agent,
    )


def episode_file_json(inp: EpisodeInput) -> dict[str, Any]:
    """The episode.json document for `inp` (what a step writes for an agent pod)."""
    ep = inp.endpoint
    return EpisodeFile(
        prompt=inp.prompt,
        endpoint=EpisodeEndpointFile(base_url=ep.base_url, model=ep.model, api_key_env=ep.api_key_env),
        limits=inp.limits,
        sampling=inp.sampling,
        harness=inp.harness,
        seed=inp.seed,
        files=inp.files,
        single_agent=inp.single_agent,
    ).model_dump(mode="json", exclude=set() if inp.single_agent else {"single_agent"})  # team files stay as they were


@lru_cache(maxsize=1)
def status_validator():
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def validate_status(status: dict[str, Any]) -> None:
    """Raise ValueError naming every field of `status` that breaks the episode-status schema."""
    errors = sorted(status_validator().iter_errors(status), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"$.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]
        raise ValueError("status.json does not match episode-status.schema.json:\n" + "\n".join(lines))


def seed_workspace(workspace: Path, files: dict[str, str]) -> None:
    from mass_jobs.sandbox import resolve_in_workspace

    workspace.mkdir(parents=True, exist_ok=True)
    for relpath, text in sorted(files.items()):
        path = resolve_in_workspace(workspace, relpath)  # a seed file may not escape either
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_episode(inp: EpisodeInput, workspace: Path, out_dir: Path, sandbox=None, qwen=None,
                qwen_uid: int | None = None) -> EpisodeResult:
    """One episode; see the module docstring. Bad input (unknown harness, escaping seed file) raises ValueError.

    With `sandbox` (a SandboxClient: an agent pod's sandbox container) the seeded workspace is handed
    to it, every tool and shell command runs there, and its workspace comes back into `workspace` at
    the end. qwen-code runs in `qwen` (the pod's qwen-code container, on the same workspace volume)
    when given, else in `sandbox`. With `qwen_uid` the proxy serves only that uid under qwen-code and
    only this process's uid under the built-in harness (mass_jobs.proxy.peer_uid)."""
    import os
    import secrets

    from mass_jobs.proxy import RecordingProxy

    if inp.harness not in HARNESSES:
        raise ValueError(f"harness: expected one of {', '.join(HARNESSES)}, got {inp.harness!r}")
    if inp.single_agent and inp.harness != "builtin":
        raise ValueError(f"single_agent: expected harness 'builtin', got {inp.harness!r}")
    workspace, out_dir = Path(workspace), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_workspace(workspace, inp.files)
    trace_path = out_dir / "trace.jsonl"
    trace_path.unlink(missing_ok=True)
    if sandbox is None and inp.harness == "qwen-code":
        from mass_jobs.sandbox_service import local_sandbox

        # qwen-code in a sandbox of its own, its shell commands sandboxed apart from it, the trace out of view
        with local_sandbox(workspace, inp.limits) as local:
            if local is not None:
                return run_episode(inp, workspace, out_dir, sandbox=local)
    started = time.monotonic()
    handed = sandbox is not None and not sandbox.shares_workspace
    lost = _hand_over(sandbox, workspace) if handed else (_wait_ready(sandbox) if sandbox is not None else None)
    if lost is None and qwen is not None and inp.harness == "qwen-code":
        lost = _wait_ready(qwen)
    if lost is not None:
        result = lost
    else:
        # Only the harness holds the proxy's token (qwen-code's shells run elsewhere, without it), and
        # in a pod only the calling uid the harness needs is served: a call the agent's code makes
        # on its own is refused, whatever it found.
        peers = None if qwen_uid is None else frozenset({qwen_uid} if inp.harness == "qwen-code" else {os.getuid()})
        with RecordingProxy(upstream=inp.endpoint, trace_path=trace_path, timeout_s=inp.limits.request_timeout_s,
                            max_reply_bytes=inp.limits.reply_bytes,
                            client_token=secrets.token_urlsafe(24), peer_uids=peers) as proxy:
            if inp.harness == "builtin":
                result = _run_builtin(inp, proxy.endpoint, workspace, sandbox)
            else:
                from mass_jobs.harness.qwen_code import run_qwen_code

                result = run_qwen_code(inp, proxy.endpoint, workspace, trace_path, qwen or sandbox)
        # after the proxy stopped (its last record is written after its reply went out)
        if proxy.write_error is not None:  # the trace lacks calls: no outcome of the model's
            result = replace(result, outcome="infra_error",
                             reason=f"the trace could not be written, calls after it were refused: {proxy.write_error}")
        if handed:
            result = _take_back(sandbox, workspace, result)
    status = {
        "outcome": result.outcome,
        "reason": result.reason,
        "harness": inp.harness,
        "counts": result.counts,
        "tokens": result.tokens,
        "timings": {"wall_s": round(time.monotonic() - started, 3)},
        "sandbox": {"network_isolated": result.network_isolated, "note": result.sandbox_note,
                    **({"memory_limit": result.memory_limit} if result.memory_limit else {})},
    }
    try:
        validate_status(status)
    except ValueError as exc:  # a value nothing should produce: the episode still ends classified
        status.update(
            outcome="infra_error",
            reason=f"episode status did not validate: {exc}"[:4000],
            counts={k: max(0, int(v)) for k, v in result.counts.items()},
            tokens={k: max(0, int(v)) for k, v in result.tokens.items()},
        )
        validate_status(status)
    status_path = out_dir / "status.json"
    from mass_jobs.store.base import replace_atomically

    # all or nothing: a full disk leaves no torn status (mass episode exits 1 naming it)
    replace_atomically(status_path, lambda tmp: tmp.write_text(json.dumps(status, indent=2, sort_keys=True) + "\n"))
    return EpisodeResult(
        outcome=result.outcome,
        reason=result.reason,
        status=status,
        workspace=workspace,
        trace_path=trace_path,
        status_path=status_path,
        final_report=result.final_report,
    )


def _hand_over(sandbox, workspace: Path) -> HarnessOutcome | None:
    """The seeded workspace goes to the sandbox container (the harness keeps no copy to work on);
    an infra_error outcome when the sandbox cannot take it."""
    import shutil

    from mass_jobs.sandbox_service import SandboxError

    lost = _wait_ready(sandbox)
    if lost is not None:
        return lost
    try:
        sandbox.put_workspace(workspace)
    except SandboxError as exc:
        return _sandbox_lost(exc)
    shutil.rmtree(workspace)
    return None


def _wait_ready(sandbox) -> HarnessOutcome | None:
    from mass_jobs.sandbox_service import SandboxError

    try:
        sandbox.wait_ready()
    except SandboxError as exc:
        return _sandbox_lost(exc)
    return None


def _sandbox_lost(exc: Exception) -> HarnessOutcome:
    """No model call was made: the sandbox never took the episode."""
    isolated, note = _sandbox_capability()
    return HarnessOutcome("infra_error", str(exc)[:4000], {"turns": 0, "tool_calls": 0, "delegations": 0, "agents": 0},
                          {"prompt": 0, "completion": 0}, isolated, note)


def _take_back(sandbox, workspace: Path, result: HarnessOutcome) -> HarnessOutcome:
    """The sandbox's workspace back into `workspace`; if it cannot be had, an infra_error episode."""
    from mass_jobs.sandbox_service import SandboxError

    try:
        sandbox.get_workspace(workspace)
    except SandboxError as exc:
        workspace.mkdir(parents=True, exist_ok=True)
        result.outcome, result.reason = "infra_error", f"{exc}"[:4000]
    return result


def _run_builtin(inp: EpisodeInput, endpoint: Endpoint, workspace: Path, sandbox=None) -> HarnessOutcome:
    from mass_jobs.harness.builtin import BuiltinHarness

    harness = BuiltinHarness(endpoint, workspace, inp.limits, inp.sampling, seed=inp.seed, single_agent=inp.single_agent,
                             sandbox=sandbox)
    try:
        outcome, reason, report = harness.run(inp.prompt)
    except Exception as exc:  # a harness bug must still leave a classified status.json behind
        outcome, reason, report = "infra_error", f"harness error: {type(exc).__name__}: {exc}", ""
    t = harness.tally
    memory = None
    if t.shell_calls:
        isolated = bool(t.network_isolated)
        memory = "sampled" if "sampled" in t.memory_limits else min(t.memory_limits)  # the weakest that held one
        note = (f"{t.shell_calls} shell command(s) ran sandboxed; network {'isolated' if isolated else 'NOT isolated'}; "
                f"memory held by {'the kernel (' + memory + ')' if memory != 'sampled' else 'sampling the tree'}")
    else:
        isolated, note = _sandbox_capability()
    return HarnessOutcome(
        outcome=outcome,
        reason=reason,
        counts={
            "turns": t.turns,
            "tool_calls": t.tool_calls,
            "delegations": t.delegations,
            "agents": t.agents,
            "tool_errors": t.tool_errors,
        },
        tokens={"prompt": t.prompt_tokens, "completion": t.completion_tokens},
        network_isolated=isolated,
        sandbox_note=note,
        final_report=report,
        memory_limit=memory,
    )


def _sandbox_capability() -> tuple[bool, str]:
    """No shell command ran, so no isolation was observed; say so rather than guess."""
    return False, "no shell command ran; network isolation not observed"


__all__ = [
    "EpisodeInput",
    "EpisodeResult",
    "EpisodeFile",
    "HarnessOutcome",
    "OUTCOMES",
    "episode_file_json",
    "load_episode_file",
    "run_episode",
    "validate_status",
]
