"""What evaluate judges and who judges it: every pair of a generation's rollout with its baselines'
(their store keys and workspace bundles), the self-evaluators' verdicts and the verdicts' keys; a
member whose verdicts are all stored is read back without serving its model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.config.task_spec import Task
from mass_jobs.judging import compare
from mass_jobs.judging.judges import PairJob, PanelMember, run_panel, verdict_key
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import client_for


def verdict_prefix(ctx: RunContext) -> str:
    return ctx.verdicts()


def rollout_prefix(ctx: RunContext, g: int, task: str, rep: int) -> str:
    return ctx.eval_rollout(g, task, rep)


def baselines(gen: int) -> list[int]:
    """The generations L_G is compared with: L_0 and the previous generation."""
    if gen < 1:
        raise ValueError(f"evaluate --gen: expected a generation >= 1 (L_G is compared with L_0), got {gen}")
    return sorted({0, gen - 1})


def self_evaluators(gen: int) -> list[int]:
    """Generations whose own model judges the pairs of this step (L_0 is judged once, at G = 1)."""
    return [0, 1] if gen == 1 else [gen]


@dataclass
class BundleCache:
    """Workspace bundles of stored rollouts, extracted once per step."""

    ctx: RunContext
    root: Path

    def __post_init__(self):
        self._cache: dict[tuple[int, str, int], str] = {}

    def get(self, g: int, task: Task, rep: int) -> str:

        key = (g, task.id, rep)
        if key not in self._cache:
            prefix = rollout_prefix(self.ctx, g, task.id, rep)
            ws = self.root / f"gen-{g}" / task.id / f"rep-{rep}"
            self._cache[key] = compare.task_bundle(self.ctx.store, prefix, self.ctx.spec, task, workspace=ws)
        return self._cache[key]


def pair_jobs(ctx: RunContext, gen: int, bundles: BundleCache | None) -> list:
    """Every (L_gen rep r, baseline rep r) pair; without `bundles` only what names them (verdict keys)."""

    jobs = []
    for b in baselines(gen):
        for t in ctx.spec.resolved_tasks():
            for r in range(ctx.spec.evaluation.rollouts_per_task):
                jobs.append(
                    PairJob(
                        task=t.id,
                        replicate=r,
                        candidate=gen,
                        baseline=b,
                        task_prompt=t.judged_text,
                        candidate_bundle=bundles.get(gen, t, r) if bundles else "",
                        baseline_bundle=bundles.get(b, t, r) if bundles else "",
                    )
                )
    return jobs


def self_verdicts(ctx: RunContext, jobs, h: int, serve, note) -> list[dict]:
    """L_h's verdict on every pair (those stored are read back; no server when all are)."""
    spec = ctx.spec
    seeds = (spec.search.seed,)
    with endpoint_unless_stored(ctx.store, verdict_prefix(ctx), jobs, f"gen-{h}", "self", seeds, serve) as endpoint:
        member = PanelMember(
            name=f"gen-{h}",
            model=f"gen-{h}",
            seeds=seeds,
            kind="self",
            client=client_for(spec, endpoint) if endpoint else None,
        )
        return run_panel(
            ctx.store, verdict_prefix(ctx), jobs, [member], spec.evaluation.verdict_retries, on_verdict=note
        )


def all_stored(store, prefix, jobs, name: str, kind: str, seeds) -> bool:

    m = PanelMember(name=name, model="", seeds=tuple(seeds), client=None, kind=kind)
    return all(store.exists(verdict_key(prefix, j, m, s)) for j in jobs for s in seeds)


@contextlib.contextmanager
def endpoint_unless_stored(store, prefix, jobs, name: str, kind: str, seeds, serve) -> Iterator[Any]:
    """An endpoint from `serve()`, or None when every verdict of this member is stored (no server)."""
    if all_stored(store, prefix, jobs, name, kind, seeds):
        yield None
        return
    with serve() as endpoint:
        yield endpoint


def verdict_keys(prefix, jobs, gen: int, spec: RunSpec) -> list[str]:

    members = [
        PanelMember(name=f"gen-{h}", model="", seeds=(spec.search.seed,), client=None, kind="self")
        for h in self_evaluators(gen)
    ]
    members += [PanelMember(name=j.name, model=j.model, seeds=tuple(j.seeds), client=None) for j in spec.judges]
    return [verdict_key(prefix, job, m, s) for job in jobs for m in members for s in m.seeds]
