"""Agent episodes of search and evaluate, in the shape collect has on the cluster.

A rollout is a store dir (`RunContext.search_rollout`, `RunContext.eval_rollout`). Locally the
episode runs in the calling process (shell commands sandboxed; `episode_executor`, `rollout`) and
its files are stored directly; its seed derives from names alone (`derived_seed`).
On the cluster the step's `--phase prepare` writes the agent pod's input (`input/episode.json` in
`mass episode`'s format, `input/workspace.tar.gz`, the seeded workspace) and lists the rollouts
that need an agent pod; the pod runs `mass episode` with no store credential, Argo uploads its
`output/{workspace.tar.gz,trace.jsonl,status.json}`, and `--phase ingest --rollout KEY` validates
and stores them. An agent pod that left no status (failed, evicted, past its deadline, retries
spent) is stored as an infra_error episode, so one lost pod never fails the step. Both paths store
the same bytes for the same episode.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mass_jobs.context import RunContext
from mass_jobs.errors import StepFailed

AGENT_OUTPUTS = ("workspace.tar.gz", "trace.jsonl", "status.json")
ROLLOUTS_OUTPUT = "rollouts"  # `--outputs DIR`: DIR/rollouts, the JSON list the agent fan-out reads
MODELS_OUTPUT = "models"  # evaluate: DIR/models, the generations whose InferenceServices it needs


# execute(prompt, seed files, workspace, out_dir, seed) -> status.json content (out_dir gets trace.jsonl, status.json)
Execute = Callable[[str, dict, Path, Path, int], dict]


def derived_seed(*parts: Any) -> int:
    """A stable 31-bit seed from the run seed and names (same on every machine and rerun)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def episode_executor(spec, endpoint) -> Execute:
    """The real rollout: `mass_jobs.harness.run_episode` with the spec's limits, sampling and harness."""

    from mass_jobs.roles import role_endpoint

    endpoint = role_endpoint(spec, "executor") or endpoint  # roles.executor, else the generation

    def execute(prompt: str, files: dict, workspace: Path, out_dir: Path, seed: int, single_agent: bool = False) -> dict:
        from mass_jobs.harness import EpisodeInput, run_episode

        inp = EpisodeInput(
            prompt=prompt, endpoint=endpoint, limits=spec.execution.limits, sampling=spec.model.sampling,
            harness=spec.execution.harness, seed=seed, files=dict(files), single_agent=single_agent,
        )
        return run_episode(inp, workspace, out_dir).status

    return execute


ROLLOUT_FILES = ("prompt.txt", "workspace.tar.gz", "trace.jsonl", "status.json")


def rollout(ctx: RunContext, prefix: str, execute: Execute, prompt: str, files: dict, seed: int) -> dict:
    """Run one episode here and persist prompt, workspace, trace and status under `prefix`; return status."""
    with tempfile.TemporaryDirectory(prefix="mass-rollout-") as tmp:
        workspace, out = Path(tmp) / "workspace", Path(tmp) / "out"
        workspace.mkdir()
        out.mkdir()
        status = execute(prompt, files, workspace, out, seed)
        trace = out / "trace.jsonl"
        store_rollout(ctx, prefix, prompt, workspace_archive=None, workspace=workspace,
                      trace=trace.read_bytes() if trace.exists() else b"", status=status)
    return status


def store_rollout(ctx: RunContext, prefix: str, prompt: str, *, status: dict, trace: bytes,
                  workspace: Path | None = None, workspace_archive: bytes | None = None) -> None:
    """ROLLOUT_FILES of one rollout, status last (its presence says the rollout is stored)."""
    store = ctx.store
    store.put_bytes(ctx.rollout_file(prefix, "prompt.txt"), prompt.encode())
    if workspace is not None:
        store.put_dir(ctx.rollout_file(prefix, "workspace.tar.gz"), workspace)
    else:
        store.put_bytes(ctx.rollout_file(prefix, "workspace.tar.gz"), workspace_archive)
    store.put_bytes(ctx.rollout_file(prefix, "trace.jsonl"), trace)
    store.put_json(ctx.rollout_file(prefix, "status.json"), status)


def rollout_outputs(ctx: RunContext, prefix: str) -> list[str]:
    return [ctx.rollout_file(prefix, n) for n in ROLLOUT_FILES]


class RolloutError(StepFailed):
    pass


def fanout_item(ctx: RunContext, prefix: str, task: str, label: str, gen: int) -> dict:
    """One item of the agent fan-out: the rollout's key relative to the run (the agent pod's
    artifacts live under it) and pod labels (gen, task, episode)."""
    return {"rollout": ctx.relative(prefix), "gen": str(gen), "task": task, "label": label}


def write_outputs(out_dir: str | None, **lists: list) -> None:
    """`--outputs DIR`: one JSON file per list (Argo output parameters for `withParam`)."""
    import json

    if not out_dir:
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for name, items in lists.items():
        (Path(out_dir) / name).write_text(json.dumps(items, sort_keys=True))


def prepare(ctx: RunContext, prefix: str, inp) -> list[str]:
    """Write the agent pod's input for the rollout at `prefix` (a harness.EpisodeInput); an earlier
    attempt's output is dropped so ingest never promotes a stale one."""
    from mass_jobs.harness import episode_file_json, seed_workspace

    store = ctx.store
    for name in AGENT_OUTPUTS:
        store.delete(ctx.agent_output(prefix, name))
    with tempfile.TemporaryDirectory(prefix="mass-prepare-") as tmp:
        workspace = Path(tmp) / "workspace"
        seed_workspace(workspace, inp.files)
        store.put_json(ctx.agent_input(prefix, "episode.json"), episode_file_json(inp))
        store.put_dir(ctx.agent_input(prefix, "workspace.tar.gz"), workspace)
    return [ctx.agent_input(prefix, "episode.json"), ctx.agent_input(prefix, "workspace.tar.gz")]


def lost_agent_status(harness: str) -> dict:
    """status.json of an episode whose agent pod left none (failed, evicted or past its deadline)."""
    return {"outcome": "infra_error", "reason": "the agent pod ended without writing status.json "
            "(failed, evicted or killed at its deadline; its retries are spent)", "harness": harness,
            "counts": {"turns": 0, "tool_calls": 0, "delegations": 0, "agents": 0},
            "tokens": {"prompt": 0, "completion": 0}, "timings": {"wall_s": 0},
            "sandbox": {"network_isolated": False, "note": "no record: the pod left no output"}}


def agent_result(ctx: RunContext, prefix: str, agent_failed: bool) -> tuple[dict, dict[str, bytes], dict]:
    """(status, {workspace.tar.gz, trace.jsonl: bytes}, episode.json) of the agent pod of `prefix`.

    With `agent_failed` (the agent step's phase was Failed or Error) a missing output is the
    infra_error episode of `lost_agent_status`; otherwise it is an error (not run yet)."""
    from mass_jobs.harness import validate_status

    store = ctx.store
    inp_key = ctx.agent_input(prefix, "episode.json")
    if not store.exists(inp_key) or not store.exists(ctx.agent_input(prefix, "workspace.tar.gz")):
        raise RolloutError(f"rollout {prefix}: cannot ingest, not prepared (run --phase prepare, then the agent pod)")
    episode = store.get_json(inp_key)
    out = {n: ctx.agent_output(prefix, n) for n in AGENT_OUTPUTS}
    if store.exists(out["status.json"]):
        missing = [n for n, k in out.items() if not store.exists(k)]
        if missing:
            raise RolloutError(f"rollout {prefix}: cannot ingest, the agent pod's output lacks {missing}")
        status = store.get_json(out["status.json"])
        validate_status(status)
        return status, {n: store.get_bytes(out[n]) for n in ("workspace.tar.gz", "trace.jsonl")}, episode
    if not agent_failed:
        raise RolloutError(f"rollout {prefix}: cannot ingest, the agent pod's output is missing "
                           f"(run the agent pod after --phase prepare)")
    status = lost_agent_status(episode.get("harness", "builtin"))
    validate_status(status)
    return status, {"workspace.tar.gz": store.get_bytes(ctx.agent_input(prefix, "workspace.tar.gz")),
                    "trace.jsonl": b""}, episode


def find_rollout(ctx: RunContext, rel: str, candidates: list[str]) -> str:
    """The rollout dir named by `--rollout REL` (a key relative to the run), among the step's own."""
    key = ctx.under_run(rel.strip("/"))
    if key not in candidates:
        raise RolloutError(f"--rollout: {rel!r} is not a rollout of this step (expected one of "
                           f"{[ctx.relative(c) for c in candidates][:6]}...)")
    return key
