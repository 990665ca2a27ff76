"""Agent episodes: one prompt, one workspace, one model endpoint -> workspace + trace + status.

`run_episode(EpisodeInput.from_spec(spec, endpoint, request), workspace, out_dir)` seeds the workspace, starts a RecordingProxy in
front of the endpoint (every model call of the episode lands in `out_dir/trace.jsonl`), runs the
chosen harness (`builtin`: the Python orchestrator/worker runtime; `qwen-code`: the npm CLI) and
writes `out_dir/status.json`, validated against schemas/episode-status.schema.json. It never raises
for what a model or endpoint does: those end as a classified outcome. Run one episode in a pod or
locally with `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from mass_jobs.config.errors import SandboxError
from mass_jobs.episodes.builtin import BuiltinHarness
from mass_jobs.episodes.episode import (  # noqa: F401 (the package's names)
    CAPS,
    HARNESSES,
    OUTCOMES,
    SCHEMA_PATH,
    TOOL_CALL_CAP,
    EpisodeEndpointFile,
    EpisodeFile,
    EpisodeInput,
    EpisodeRequest,
    EpisodeResult,
    HarnessOutcome,
    episode_cap,
    episode_file_json,
    episode_input,
    load_episode_file,
    seed_workspace,
    status_text,
    status_validator,
    validate_status,
)
from mass_jobs.sandbox.run import outer_boundary
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.proxy import RecordingProxy
from mass_jobs.serving.startup_view import as_reminder
from mass_jobs.store.base import replace_atomically


def run_episode(
    inp: EpisodeInput, workspace: Path, out_dir: Path, sandbox=None, qwen=None, qwen_uid: int | None = None, egress=None
) -> EpisodeResult:
    """One episode; see the module docstring. Bad input (unknown harness, escaping seed file) raises ValueError.

    With `sandbox` (a SandboxClient: an agent pod's sandbox container) the seeded workspace is handed
    to it, every tool and shell command runs there, and its workspace comes back into `workspace` at
    the end. qwen-code runs in `qwen` (the pod's qwen-code container, on the same workspace volume)
    when given, else in `sandbox`. With `qwen_uid` the proxy serves only that uid under qwen-code and
    only this process's uid under the built-in harness (mass_jobs.serving.proxy.peer_uid).

    With `inp.network` (execution.network's hosts) an EgressProxy of this process is the only way
    out of the shell commands run on this machine, recording into `out_dir/network.jsonl`; status.json
    counts its requests. In an agent pod `egress` is the run's proxy instead (a RemoteEgress: the
    pod's NetworkPolicy is the boundary), whose record of this rollout lands in the same file."""
    if inp.harness not in HARNESSES:
        raise ValueError(f"harness: expected one of {', '.join(HARNESSES)}, got {inp.harness!r}")
    if inp.single_agent and inp.harness != "builtin":
        raise ValueError(f"single_agent: expected harness 'builtin', got {inp.harness!r}")
    workspace, out_dir = Path(workspace), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_workspace(workspace, inp.files)
    trace_path = out_dir / "trace.jsonl"
    trace_path.unlink(missing_ok=True)
    with ExitStack() as around:
        # set up what was not given: this process's egress proxy, and qwen-code's sandbox of its own
        # (its shell commands sandboxed apart from it, the trace out of its view)
        if inp.network is not None and egress is None and sandbox is None:
            egress = around.enter_context(_egress_proxy(inp.network, out_dir))
        if sandbox is None and inp.harness == "qwen-code":
            from mass_jobs.episodes.sandbox_local import local_sandbox

            sandbox = around.enter_context(local_sandbox(workspace, inp.limits, egress.way if egress else None))
            if sandbox is not None:  # a pod's qwen-code container and uid belong to a pod's sandbox
                qwen, qwen_uid = None, None
        # run
        started = time.monotonic()
        handed = sandbox is not None and not sandbox.shares_workspace
        result = _run_harness(inp, workspace, trace_path, sandbox, qwen, qwen_uid, egress, handed)
        # record
        status = _status(inp, result, time.monotonic() - started, handed, egress)
        status_path = out_dir / "status.json"
        # all or nothing: a full disk leaves no torn status (mass episode exits 1 naming it)
        replace_atomically(status_path, lambda tmp: tmp.write_text(status_text(status)))
    return EpisodeResult(
        outcome=status["outcome"],
        reason=status["reason"],
        status=status,
        workspace=workspace,
        trace_path=trace_path,
        status_path=status_path,
        final_report=result.final_report,
    )


def _run_harness(
    inp: EpisodeInput, workspace: Path, trace_path: Path, sandbox, qwen, qwen_uid: int | None, egress, handed: bool
) -> HarnessOutcome:
    """The harness behind the recording proxy, once its sandbox, qwen-code and egress answer; the
    workspace taken back from a sandbox it was handed to."""
    egress_socket = egress.way if egress is not None else None
    lost = _hand_over(sandbox, workspace) if handed else (_wait_ready(sandbox) if sandbox is not None else None)
    if lost is None and qwen is not None and inp.harness == "qwen-code":
        lost = _wait_ready(qwen)
    if lost is None and sandbox is not None and egress is not None and hasattr(egress, "begin"):
        lost = _reach_egress(egress, sandbox)
    if lost is not None:
        return lost
    # Only the harness holds the proxy's token (qwen-code's shells run elsewhere, without it), and
    # in a pod only the calling uid the harness needs is served: a call the agent's code makes
    # on its own is refused, whatever it found.
    peers = None if qwen_uid is None else frozenset({qwen_uid} if inp.harness == "qwen-code" else {os.getuid()})
    view = as_reminder if inp.harness == "qwen-code" and inp.startup_context == "reminder" else None
    with RecordingProxy(
        upstream=inp.endpoint,
        trace_path=trace_path,
        timeout_s=inp.limits.request_timeout_s,
        max_reply_bytes=inp.limits.reply_bytes,
        client_token=secrets.token_urlsafe(24),
        peer_uids=peers,
        rewrite=view,
    ) as proxy:
        if inp.harness == "builtin":
            result = _run_builtin(inp, proxy.endpoint, workspace, sandbox, egress_socket)
        elif qwen or sandbox:
            from mass_jobs.episodes.qwen_code import run_qwen_code

            result = run_qwen_code(inp, proxy.endpoint, workspace, trace_path, qwen or sandbox)
        else:  # qwen-code started here: its shell commands still go to a shell-only service
            from mass_jobs.episodes.qwen_code import run_qwen_code
            from mass_jobs.episodes.sandbox_local import shell_service

            with shell_service(workspace, inp.limits, egress_socket) as shells:
                result = run_qwen_code(inp, proxy.endpoint, workspace, trace_path, shells=shells)
    # after the proxy stopped (its last record is written after its reply went out)
    if proxy.write_error is not None:  # the trace lacks calls: no outcome of the model's
        result = replace(
            result,
            outcome="infra_error",
            reason=f"the trace could not be written, calls after it were refused: {proxy.write_error}",
        )
    return _take_back(sandbox, workspace, result) if handed else result


def _status(inp: EpisodeInput, result: HarnessOutcome, wall_s: float, handed: bool, egress) -> dict:
    """status.json's content, validated: a value nothing should produce still ends classified."""
    status = {
        "outcome": result.outcome,
        "reason": result.reason,
        "harness": inp.harness,
        "counts": result.counts,
        "tokens": result.tokens,
        "timings": {"wall_s": round(wall_s, 3)},
        "sandbox": {
            "network_isolated": result.network_isolated,
            "note": result.sandbox_note,
            # the opt-out is on record in every episode it touched (a pod's or bwrap's is the norm)
            **({"boundary": "none"} if not handed and outer_boundary() == "none" else {}),
            **({"memory_limit": result.memory_limit} if result.memory_limit else {}),
        },
    }
    if egress is not None:  # what the shell commands' code reached, as the egress proxy recorded it
        from mass_jobs.sandbox.egress import EgressUnavailable

        try:  # with the hosts the episode was allowed: the spec's and its task's
            status["network"] = {**egress.settled_summary(), "allow": list(inp.network or ())}
        except EgressUnavailable as exc:  # what the code reached is not known: nothing to learn from
            status.update(outcome="infra_error", reason=str(exc)[:4000])
    try:
        validate_status(status)
    except ValueError as exc:
        status.update(
            outcome="infra_error",
            reason=f"episode status did not validate: {exc}"[:4000],
            counts={k: max(0, int(v)) for k, v in result.counts.items()},
            tokens={k: max(0, int(v)) for k, v in result.tokens.items()},
        )
        validate_status(status)
    return status


@contextmanager
def _egress_proxy(hosts: tuple[str, ...], out_dir: Path):
    """The episode's egress proxy on a socket in a private folder (the sandboxes get the socket alone)."""
    import shutil
    import tempfile

    from mass_jobs.sandbox.egress import EgressProxy

    sockdir = Path(tempfile.mkdtemp(prefix="mass-egress-"))
    try:
        with EgressProxy(list(hosts), out_dir / "network.jsonl", sockdir / "egress.sock") as proxy:
            yield proxy
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


def _hand_over(sandbox, workspace: Path) -> HarnessOutcome | None:
    """The seeded workspace goes to the sandbox container (the harness keeps no copy to work on);
    an infra_error outcome when the sandbox cannot take it."""
    import shutil

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
    try:
        sandbox.wait_ready()
    except SandboxError as exc:
        return _sandbox_lost(exc)
    return None


def _reach_egress(egress, sandbox) -> HarnessOutcome | None:
    """The run's egress proxy (an agent pod's): its cursor taken, its address given to the sandbox."""
    from mass_jobs.sandbox.egress import EgressUnavailable

    try:
        egress.begin()
        sandbox.set_egress(egress.way)
    except (EgressUnavailable, SandboxError) as exc:
        return _sandbox_lost(exc)
    return None


def _sandbox_lost(exc: Exception) -> HarnessOutcome:
    """No model call was made: the sandbox never took the episode."""
    isolated, note = _sandbox_capability()
    return HarnessOutcome(
        "infra_error",
        str(exc)[:4000],
        {"turns": 0, "tool_calls": 0, "delegations": 0, "agents": 0},
        {"prompt": 0, "completion": 0},
        isolated,
        note,
    )


def _take_back(sandbox, workspace: Path, result: HarnessOutcome) -> HarnessOutcome:
    """The sandbox's workspace back into `workspace`; if it cannot be had, an infra_error episode."""
    try:
        sandbox.get_workspace(workspace)
    except SandboxError as exc:
        workspace.mkdir(parents=True, exist_ok=True)
        result.outcome, result.reason = "infra_error", f"{exc}"[:4000]
    return result


def _run_builtin(
    inp: EpisodeInput, endpoint: Endpoint, workspace: Path, sandbox=None, egress: str | None = None
) -> HarnessOutcome:

    harness = BuiltinHarness(
        endpoint,
        workspace,
        inp.limits,
        inp.sampling,
        seed=inp.seed,
        single_agent=inp.single_agent,
        sandbox=sandbox,
        egress=egress,
    )
    try:
        outcome, reason, report = harness.run(inp.prompt)
    except Exception as exc:  # a harness bug must still leave a classified status.json behind
        outcome, reason, report = "infra_error", f"harness error: {type(exc).__name__}: {exc}", ""
    t = harness.tally
    memory = None
    if t.shell_calls:
        isolated = bool(t.network_isolated)
        memory = "sampled" if "sampled" in t.memory_limits else min(t.memory_limits)  # the weakest that held one
        note = (
            f"{t.shell_calls} shell command(s) ran sandboxed; network {'isolated' if isolated else 'NOT isolated'}; "
            f"memory held by {'the kernel (' + memory + ')' if memory != 'sampled' else 'sampling the tree'}"
        )
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
