"""Checkpoint selection by the external judge panel (a control: the paper selects by validation loss).

With `sft.checkpoint_selection: panel` (or a `+` preset) the `sft.panel.checkpoints` saved steps with
the lowest validation losses are candidates. Each candidate (the parent with that LoRA checkpoint
merged) and the parent L_g itself run every `sft.panel.tasks` held-out task `rollouts` times on its
bare prompt; every judge x seed of the panel compares candidate vs parent on each matched replicate
(the evaluate step's verdict code, blind, position balanced). The candidate with the highest win
share (wins / decisive verdicts) is selected; equal shares go to the lower validation loss, then the
earlier step. With no decisive verdict at all, the lowest validation loss is kept and the fallback is
recorded. Budget: (checkpoints + 1) x tasks x rollouts episodes and checkpoints x tasks x rollouts x
seeds verdicts, both recorded. Rollouts and verdicts are stored as they finish, so a rerun resumes.

No CLI of its own: `mass select` runs it when the spec asks for panel selection.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.episodes import rollouts
from mass_jobs.episodes.driver import Driver, Rollout
from mass_jobs.judging.compare import task_bundle
from mass_jobs.judging.judges import PairJob, PanelMember, run_panel
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import generation_servers, local_model_dir, model_ref
from mass_jobs.serving.roles import client_for
from mass_jobs.serving.serve import ModelServer
from mass_jobs.steps.evaluate import episode_request, rollout_seed
from mass_jobs.steps.merge import merge_lora
from mass_jobs.store import MODEL_LIMITS, Step

# step -> a context manager serving the parent merged with that checkpoint (yields an Endpoint)
ServeCheckpoint = Callable[[int], AbstractContextManager[Any]]


@dataclass(frozen=True)
class CheckpointPair(PairJob):
    """candidate = a checkpoint's step, baseline = the parent generation."""

    @property
    def name(self) -> str:
        return RunContext.verdict_pair(f"step-{self.candidate}", f"gen-{self.baseline}", self.task, self.replicate)


def panel_candidates(val: dict[int, float], n: int) -> list[int]:
    """The n steps with the lowest finite validation losses (ties: the earlier step), in that order."""
    return [s for _, s in sorted((loss, s) for s, loss in val.items())[:n]]


def candidate_won(record: dict) -> bool | None:
    """True/False for a decisive verdict on the candidate, None for a tie or an invalid verdict."""
    if not record.get("valid") or record.get("winner") not in ("A", "B"):
        return None
    return (record["winner"] == "A") == (record["order"] == "candidate_first")


def tally(records: list[dict]) -> dict:
    won = [candidate_won(r) for r in records]
    wins, losses = won.count(True), won.count(False)
    ties = sum(1 for r in records if r.get("valid") and r.get("winner") == "tie")
    return {
        "wins": wins,
        "losses": losses,
        "ties": ties,
        "invalid": sum(1 for r in records if not r.get("valid")),
        "win_share": wins / (wins + losses) if wins + losses else None,
    }


def choose(per_step: dict[int, dict]) -> tuple[int, str | None]:
    """(selected step, fallback reason or None) from each candidate's tally and val_loss."""
    decisive = [(s, t) for s, t in per_step.items() if t["win_share"] is not None]
    if not decisive:
        return min(
            per_step, key=lambda s: (per_step[s]["val_loss"], s)
        ), "no decisive panel verdict: lowest validation loss"
    return min(decisive, key=lambda st: (-st[1]["win_share"], st[1]["val_loss"], st[0]))[0], None


def panel_inputs(ctx, gen: int) -> dict:
    """What panel selection depends on beyond training (enters the select step's input hash)."""
    spec = ctx.spec
    return {
        "checkpoint_selection": "panel",
        "panel": spec.sft.panel.model_dump(mode="json"),
        "judges": [j.model_dump(mode="json") for j in spec.judges],
        "tasks": {t: spec.task(t).model_dump(mode="json", include={"prompt", "files"}) for t in spec.sft.panel.tasks},
        "harness": spec.execution.harness,
        "sampling": spec.model.sampling.model_dump(mode="json"),
    }


def run_selection_rollout(ctx, gen: int, who: str, task, rep: int, endpoint, model_ref: str) -> None:
    """One bare-prompt episode of `who` (the parent or a candidate, itself: never roles.executor),
    behind its own Step manifest (skipped when stored)."""

    spec = ctx.spec
    prefix = ctx.select_rollout(gen, who, task.id, rep)
    fields = {"id", "prompt", "files", *(["network"] if task.network else [])}
    step = Step(
        ctx.store,
        prefix,
        {
            "model": model_ref,
            "task": task.model_dump(mode="json", include=fields),
            "seed": rollout_seed(task.id, rep),
            "limits": spec.execution.limits.as_input(),
            "sampling": spec.model.sampling.model_dump(mode="json"),
        },
        name=f"select-rollout gen-{gen} {who} {task.id} rep-{rep}",
    )
    r = Rollout(prefix, episode_request(task, rep), task.id, f"{who}-rep-{rep}", gen, manifest=step)
    Driver(ctx, executor_role=False).run(r, rollouts.episode_runner(spec, endpoint, executor_role=False))


def judge_pairs(ctx, gen: int, candidates: list[int], jobs: list, serve_judge) -> list[dict]:
    """Each candidate's rollouts against the parent's, by every judge of the panel, one served at a time."""
    spec, store = ctx.spec, ctx.store
    pairs = [
        CheckpointPair(
            task=t.id,
            replicate=r,
            candidate=s,
            baseline=gen,
            task_prompt=t.judged_text,
            candidate_bundle=task_bundle(store, ctx.select_rollout(gen, f"step-{s}", t.id, r), spec, t),
            baseline_bundle=task_bundle(store, ctx.select_rollout(gen, "parent", t.id, r), spec, t),
        )
        for s in candidates
        for t, r in jobs
    ]
    records: list[dict] = []
    for i, judge in enumerate(spec.judges):
        with serve_judge(judge) as endpoint:
            member = PanelMember(
                name=judge.name, model=judge.model, seeds=tuple(judge.seeds), client=client_for(spec, endpoint)
            )
            records += run_panel(
                store, ctx.select_verdicts(gen), pairs, [member], spec.evaluation.verdict_retries, first_index=i
            )
    return records


def select_by_panel(
    ctx,
    gen: int,
    val: dict[int, float],
    serve_parent: Callable[[], AbstractContextManager[Any]],
    serve_checkpoint: ServeCheckpoint,
    serve_judge,
) -> dict:
    """Run the candidates' and the parent's rollouts and the panel; return the selection record."""

    spec, store, cfg = ctx.spec, ctx.store, ctx.spec.sft.panel
    tasks = [spec.task(t) for t in cfg.tasks]
    candidates = panel_candidates(val, cfg.checkpoints)
    jobs = [(t, r) for t in tasks for r in range(cfg.rollouts)]
    with serve_parent() as endpoint:
        for t, r in jobs:
            run_selection_rollout(ctx, gen, "parent", t, r, endpoint, model_ref(ctx, gen))
    for s in candidates:
        with serve_checkpoint(s) as endpoint:
            ref = (
                f"checkpoint:{store.sha256(ctx.checkpoint(gen, s))}"
                if store.exists(ctx.checkpoint(gen, s))
                else f"step-{s}"
            )
            for t, r in jobs:
                run_selection_rollout(ctx, gen, f"step-{s}", t, r, endpoint, ref)
    records = judge_pairs(ctx, gen, candidates, jobs, serve_judge)
    per_step = {s: {"val_loss": val[s], **tally([r for r in records if r["candidate"] == s])} for s in candidates}
    step, fallback = choose(per_step)
    seeds = sum(len(j.seeds) for j in spec.judges)
    return {
        "step": step,
        "val_loss": val[step],
        "by": "panel",
        "panel": {
            "tasks": list(cfg.tasks),
            "rollouts": cfg.rollouts,
            "judges": [j.name for j in spec.judges],
            "candidates": {str(s): t for s, t in per_step.items()},
            "fallback": fallback,
            "budget": {"episodes": (len(candidates) + 1) * len(jobs), "verdicts": len(candidates) * len(jobs) * seeds},
            "verdicts": len(records),
        },
    }


def default_servers(ctx, gen: int, work_dir: Path | None = None):
    """(serve_parent, serve_checkpoint, serve_judge) on the embedded server: the parent L_g, the parent
    merged with a stored checkpoint (merged once per step into the work dir), the spec's judges."""

    serve_model, serve_judge = generation_servers(ctx)
    work = Path(work_dir or tempfile.mkdtemp(prefix="mass-select-panel-"))

    @contextlib.contextmanager
    def serve_checkpoint(step: int):
        adapter, merged = work / f"adapter-{step}", work / f"merged-{step}"
        if not (merged / "config.json").exists():
            ctx.store.get_dir(ctx.checkpoint(gen, step), adapter, MODEL_LIMITS)
            merge_lora(local_model_dir(ctx, gen, work / "models"), adapter, merged)
        with ModelServer(
            merged,
            served_name=f"gen-{gen}-step-{step}",
            dtype=ctx.spec.model.dtype,
            prefix_cache_gib=ctx.spec.execution.prefix_cache_gib,
        ) as srv:
            yield srv.endpoint

    return (lambda: serve_model(gen)), serve_checkpoint, serve_judge
