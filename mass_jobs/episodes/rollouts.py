"""The protocol every agent episode is run and stored by (search, collect, guard's checks, evaluate,
panel selection, the benchmark); `episodes/driver.py` drives it for every step.

A step decides an `EpisodeRequest` (prompt, seed files, seed); `EpisodeInput.from_spec` adds what the
spec and the called model decide. Locally `run_here` runs it in this process (shell commands
sandboxed) and `store_record` stores it under the episode's store dir. On the cluster the step runs
in `Phase`s: `prepare` writes the agent pod's input (`input/episode.json` in `mass episode`'s
format, `input/workspace.tar.gz`, a fresh key) and lists the pods to run; the pod runs `mass
episode` with no store credential, Argo uploads its `output/{workspace.tar.gz,trace.jsonl,
status.json,proof.json}`; `ingest --rollout KEY` verifies them against the key
(mass_jobs/episodes/proof.py) and stores them with the same `store_record`; `finish` does the step's
own work. An agent pod that left no status (failed, evicted, past its deadline, retries spent, its
upload cut short) or outputs its harness did not sign is stored as an infra_error episode, so one
lost or forged pod never fails the step and never reaches ranking. Both paths store the same bytes
for the same episode; seeds derive from names alone (`derived_seed`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from mass_jobs.config.errors import StepFailed
from mass_jobs.episodes import harness, proof
from mass_jobs.episodes.episode import (
    EpisodeInput,
    EpisodeRequest,
    episode_file_json,
    seed_workspace,
    status_text,
    validate_status,
)
from mass_jobs.run.context import RunContext
from mass_jobs.run.sandboxing import apply_sandbox
from mass_jobs.serving.roles import role_endpoint

ENDED = ("Succeeded", "Failed", "Error")  # Argo phases of an agent step that ran and will not run again
ROLLOUTS_OUTPUT = "rollouts"  # `--outputs DIR`: DIR/rollouts, the JSON list the agent fan-out reads
ROUNDS_OUTPUT = "rounds"  # evaluate: DIR/rounds, the generations it serves, one at a time, in order


class Phase(str, Enum):
    """Where a step stands with its agent pods on Argo, in the order the cycle runs them. Locally no
    phase is given: the step runs its episodes here and does its own work in one call."""

    PLAN = "plan"  # evaluate: the rounds, each serving one generation whose model its pods or verdicts call
    PREPARE = "prepare"  # each missing episode's pod input, and the fan-out items
    INGEST = "ingest"  # one pod's signed outputs stored (a lost or forged pod as an infra_error episode)
    FINISH = "finish"  # the step's own work over what the pods left; never runs an episode here


AGENT_PHASES = (Phase.PREPARE, Phase.INGEST, Phase.FINISH)


def phase_of(
    value: str | Phase | None, allowed: tuple[Phase, ...] = AGENT_PHASES, step: str = "this step"
) -> Phase | None:
    """`--phase VALUE` as a Phase this step has (None: the local call that runs everything)."""
    if value is None:
        return None
    try:
        phase = Phase(value)
    except ValueError:
        phase = None
    if phase not in allowed:
        raise RolloutError(f"--phase: {step} has {', '.join(p.value for p in allowed)}, got {value!r}")
    return phase


# run_episode(request, workspace, out_dir) -> status.json's content; out_dir gets trace.jsonl and status.json
EpisodeRunner = Callable[[EpisodeRequest, Path, Path], dict]


def derived_seed(*parts: Any) -> int:
    """A stable 31-bit seed from the run seed and names (same on every machine and rerun)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def executor_endpoint(spec, endpoint):
    """The model a teacher or search episode calls: roles.executor when set, else the generation."""

    return role_endpoint(spec, "executor") or endpoint


def episode_runner(spec, endpoint, *, executor_role: bool = True) -> EpisodeRunner:
    """The real rollout: `run_episode` of `EpisodeInput.from_spec`. Evaluation and panel selection
    measure a generation itself, so they pass `executor_role=False` (roles.executor never plays it)."""
    endpoint = executor_endpoint(spec, endpoint) if executor_role else endpoint

    def run(request: EpisodeRequest, workspace: Path, out_dir: Path) -> dict:
        # where episodes run here: SandboxUnavailable before the first one if nothing may run (a step
        # whose episodes run in agent pods builds this runner too, and never calls it)
        apply_sandbox(spec)
        return harness.run_episode(EpisodeInput.from_spec(spec, endpoint, request), workspace, out_dir).status

    return run


RECORD = ("workspace.tar.gz", "trace.jsonl", "status.json")  # every stored episode; status.json last
NETWORK = "network.jsonl"  # beside the trace, where the episode's shell commands had the egress proxy
PROMPTED_FILES = ("prompt.txt", *RECORD)  # a search or benchmark rollout: its prompt first


@dataclass
class Ran:
    """An episode that ran here, before anything of it is stored."""

    status: dict
    workspace: Path
    out_dir: Path  # trace.jsonl, status.json as the harness wrote them

    @property
    def trace(self) -> bytes:
        trace = self.out_dir / "trace.jsonl"
        return trace.read_bytes() if trace.exists() else b""

    @property
    def network(self) -> bytes | None:
        """The egress proxy's records (execution.network), None when the episode had no network."""
        path = self.out_dir / NETWORK
        return path.read_bytes() if path.exists() else None


@contextlib.contextmanager
def run_here(
    run_episode: EpisodeRunner, request: EpisodeRequest, seeded: Callable[[Path], None] | None = None
) -> Iterator[Ran]:
    """Run one episode in this process (its shell commands sandboxed) in a workspace of its own,
    seeded from the request's files; `seeded(workspace)` sees it before the agent does."""
    with tempfile.TemporaryDirectory(prefix="mass-episode-") as tmp:
        workspace, out = Path(tmp) / "workspace", Path(tmp) / "out"
        out.mkdir()
        seed_workspace(workspace, request.files)
        if seeded is not None:
            seeded(workspace)
        yield Ran(run_episode(request, workspace, out), workspace, out)


def store_record(
    ctx: RunContext,
    prefix: str,
    *,
    status: dict,
    trace: bytes,
    workspace: Path | None = None,
    workspace_archive: bytes | None = None,
    first: dict[str, Any] | None = None,
    network: bytes | None = None,
) -> list[str]:
    """The one writer of a stored episode: `first` (name -> text, bytes or JSON: what the step adds, its
    prompt or episode document, an audit), then RECORD, status.json last (its presence says the episode
    is stored) and in the bytes the harness writes; `network`, the egress proxy's records, beside the
    trace when the episode had any. Returns the keys written, in order."""
    store, keys = ctx.store, []
    for name, value in (first or {}).items():
        key = ctx.rollout_file(prefix, name)
        if isinstance(value, bytes):
            store.put_bytes(key, value)
        elif isinstance(value, str):
            store.put_bytes(key, value.encode())
        else:
            store.put_json(key, value)
        keys.append(key)
    if workspace is not None:
        store.put_dir(ctx.rollout_file(prefix, "workspace.tar.gz"), workspace)
    else:
        store.put_bytes(ctx.rollout_file(prefix, "workspace.tar.gz"), workspace_archive)
    store.put_bytes(ctx.rollout_file(prefix, "trace.jsonl"), trace)
    if network is not None:
        store.put_bytes(ctx.rollout_file(prefix, NETWORK), network)
        keys.append(ctx.rollout_file(prefix, NETWORK))
    store.put_bytes(ctx.rollout_file(prefix, "status.json"), status_text(status).encode())
    return keys + [ctx.rollout_file(prefix, n) for n in RECORD]


def rollout_outputs(ctx: RunContext, prefix: str) -> list[str]:
    return [ctx.rollout_file(prefix, n) for n in PROMPTED_FILES]


class RolloutError(StepFailed):
    pass


def fanout_item(ctx: RunContext, prefix: str, task: str, label: str, gen: int) -> dict:
    """One item of the agent fan-out: the rollout's key relative to the run (the agent pod's
    artifacts live under it) and pod labels (gen, task, episode)."""
    return {"rollout": ctx.relative(prefix), "gen": str(gen), "task": task, "label": label}


def write_value(out_dir: str | None, name: str, value) -> None:
    """`--outputs DIR`: one value the step's template reads as an output parameter (a metric's)."""
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / name).write_text("NaN" if value is None else str(value))


def write_outputs(out_dir: str | None, **lists: list) -> None:
    """`--outputs DIR`: one JSON file per list (Argo output parameters for `withParam`)."""
    if not out_dir:
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, items in lists.items():
        (Path(out_dir) / name).write_text(json.dumps(items, sort_keys=True))


def write_phase_outputs(out_dir: str | None, phase: str | Phase | None, out: dict) -> None:
    """`--outputs DIR` of an agent step's phase, the output parameters its template reads: after
    prepare DIR/rollouts (the fan-out; collect's per-episode prepare: DIR/agent, whether its pod must
    run, and DIR/rollout, where its artifacts live); after plan DIR/rounds; after ingest
    DIR/outcome (the ingest template's metric)."""
    if not out_dir or phase is None:
        return
    phase = Phase(phase)
    if phase is Phase.PLAN:
        write_outputs(out_dir, **{ROUNDS_OUTPUT: out["rounds"]})
    elif phase is Phase.PREPARE and ROLLOUTS_OUTPUT in out:
        write_outputs(out_dir, **{ROLLOUTS_OUTPUT: out[ROLLOUTS_OUTPUT]})
    elif phase is Phase.PREPARE:
        write_value(out_dir, "agent", "true" if out.get("agent") else "false")
        write_value(out_dir, "rollout", out["rollout"])
    elif phase is Phase.INGEST:
        write_value(out_dir, "outcome", out.get("outcome") or "unknown")


def agent_ended(phase: str | None) -> bool:
    """`--agent-status`: the agent step ran and is over, so a missing output is lost, never awaited
    (a Succeeded pod without output had its upload cut short: a sidecar can end it early)."""
    return (phase or "") in ENDED


def new_inputs(ctx: RunContext, prefix: str, outputs: tuple[str, ...]) -> None:
    """Before an agent pod's input is written: drop an earlier attempt's output (ingest never
    promotes a stale one) and issue the rollout a fresh key, which only its harness reads."""
    for name in (*outputs, proof.PROOF):
        ctx.store.delete(ctx.agent_output(prefix, name))
    ctx.store.put_bytes(ctx.agent_input(prefix, proof.KEY), proof.new_key())


def signed_outputs(
    ctx: RunContext, prefix: str, outputs: tuple[str, ...]
) -> tuple[dict[str, bytes | None], str | None]:
    """(name -> uploaded bytes or None, why they are refused or None) of the agent pod of `prefix`."""
    store = ctx.store
    files = {n: store.get_bytes(k) if store.exists(k := ctx.agent_output(prefix, n)) else None for n in outputs}
    key, kept = ctx.agent_input(prefix, proof.KEY), ctx.agent_output(prefix, proof.PROOF)
    if not store.exists(key):  # prepared before pods signed their outputs: nothing to check against
        return files, None
    signed = store.get_bytes(kept) if store.exists(kept) else None
    if signed is None and all(b is None for b in files.values()):
        return files, None  # nothing uploaded: lost or not run yet, as the caller decides
    return files, proof.refusal(store.get_bytes(key), signed, files)


def prepare(ctx: RunContext, prefix: str, inp: EpisodeInput, seeded: Callable[[Path], None] | None = None) -> list[str]:
    """Write the agent pod's input for the rollout at `prefix`: episode.json and the seeded workspace
    (`seeded(workspace)` sees it first, as in `run_here`), after a fresh key (`new_inputs`)."""
    store = ctx.store
    new_inputs(ctx, prefix, proof.EPISODE_OUTPUTS)
    with tempfile.TemporaryDirectory(prefix="mass-prepare-") as tmp:
        workspace = Path(tmp) / "workspace"
        seed_workspace(workspace, inp.files)
        if seeded is not None:
            seeded(workspace)
        store.put_json(ctx.agent_input(prefix, "episode.json"), episode_file_json(inp))
        store.put_dir(ctx.agent_input(prefix, "workspace.tar.gz"), workspace)
    return input_keys(ctx, prefix)


def input_keys(ctx: RunContext, prefix: str) -> list[str]:
    """What `prepare` writes for the agent pod of `prefix`."""
    return [ctx.agent_input(prefix, n) for n in ("episode.json", "workspace.tar.gz", proof.KEY)]


LOST = (
    "the agent pod ended without writing status.json (failed, evicted, killed at its deadline or "
    "its upload cut short; its retries are spent)"
)


# On Argo's emissary any container of the pod may write /var/run/argo/ctr/main/signal (the main
# container, the harness, is then killed) or ctr/main/exitcode (its outputs are uploaded mid-episode):
# code the model wrote can end any episode it likes as infra_error. It cannot forge one (the outputs
# are signed), so what ingest can do is say so: outputs uploaded without the harness's proof.
ENDED_BY_POD = (
    "the harness did not end this episode: the pod uploaded outputs it had not signed (a signal "
    "or an exit-code file written in the pod, which Argo's emissary obeys from any container, "
    "or an upload cut short)"
)


def lost_agent_status(harness: str, reason: str = LOST, ended_by: str | None = None) -> dict:
    """status.json of an episode whose agent pod left none, or none its harness signed; `ended_by`
    "pod" where the pod uploaded outputs its harness had not signed (ENDED_BY_POD)."""
    return {
        "outcome": "infra_error",
        "reason": reason,
        "harness": harness,
        "counts": {"turns": 0, "tool_calls": 0, "delegations": 0, "agents": 0},
        "tokens": {"prompt": 0, "completion": 0},
        "timings": {"wall_s": 0},
        "sandbox": {"network_isolated": False, "note": "no record: the pod left no output"},
        **({"ended_by": ended_by} if ended_by else {}),
    }


def agent_result(ctx: RunContext, prefix: str, agent_ended: bool) -> tuple[dict, dict[str, bytes], dict]:
    """(status, {workspace.tar.gz, trace.jsonl: bytes}, episode.json) of the agent pod of `prefix`.

    Outputs the rollout's key did not sign are the infra_error episode of `lost_agent_status`
    naming why, and so is a missing output with `agent_ended` (the agent step is over); a missing
    output otherwise is an error (not run yet)."""
    store = ctx.store
    inp_key = ctx.agent_input(prefix, "episode.json")
    if not store.exists(inp_key) or not store.exists(ctx.agent_input(prefix, "workspace.tar.gz")):
        raise RolloutError(f"rollout {prefix}: cannot ingest, not prepared (run --phase prepare, then the agent pod)")
    episode = store.get_json(inp_key)
    files, refused = signed_outputs(ctx, prefix, proof.EPISODE_OUTPUTS)
    reason = None
    if refused:
        reason = f"the agent pod's outputs were refused, none is stored: {refused}"
    elif files["status.json"] is not None:
        missing = [n for n, b in files.items() if b is None and n != NETWORK]
        if missing:
            raise RolloutError(f"rollout {prefix}: cannot ingest, the agent pod's output lacks {missing}")
        status = json.loads(files["status.json"])
        validate_status(status)
        kept = ("workspace.tar.gz", "trace.jsonl", *((NETWORK,) if files.get(NETWORK) is not None else ()))
        return status, {n: files[n] for n in kept}, episode
    elif not agent_ended:
        raise RolloutError(
            f"rollout {prefix}: cannot ingest, the agent pod's output is missing "
            f"(run the agent pod after --phase prepare)"
        )
    uploaded = refused is not None and any(b is not None for b in files.values())
    status = lost_agent_status(
        episode.get("harness", "builtin"),
        f"{ENDED_BY_POD}; {reason}" if uploaded else reason or LOST,
        "pod" if uploaded else None,
    )
    validate_status(status)
    return (
        status,
        {"workspace.tar.gz": store.get_bytes(ctx.agent_input(prefix, "workspace.tar.gz")), "trace.jsonl": b""},
        episode,
    )


def find_rollout(ctx: RunContext, rel: str, candidates: list[str]) -> str:
    """The rollout dir named by `--rollout REL` (a key relative to the run), among the step's own."""
    key = ctx.under_run(rel.strip("/"))
    if key not in candidates:
        raise RolloutError(
            f"--rollout: {rel!r} is not a rollout of this step (expected one of "
            f"{[ctx.relative(c) for c in candidates][:6]}...)"
        )
    return key
