"""An agent step by declaration: what its rollouts are and what it makes of them, nothing else.

A step defined outside the package (a test, a user's module) declares an `AgentStep`: per task,
its rollouts (`driver.Rollout`, each with its manifest), where its result is stored (a `Step`), and
the result made from the rollouts' stored statuses. `pipeline.table.agent_step` makes its row of
the pipeline, and `mass rollouts --step module:NAME` is its CLI entry, so it runs as the shipped
agent steps do: here (in-process or as that entry), under the argv handler, and on Argo as a
prepare -> agent pods -> ingest -> finish fan-out. The driver does every part of it; the
declaration writes no phase of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mass_jobs.config.references import referenced
from mass_jobs.episodes.driver import Driver, Reading, Rollout, outcome_only
from mass_jobs.episodes.rollouts import EpisodeRunner, Phase, RolloutError
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import Endpoint
from mass_jobs.store import Step

RESULT = "result.json"  # the task's result, under its Step's prefix


@dataclass(frozen=True)
class AgentStep:
    # (ctx, gen, task) -> every rollout of the task (each with a manifest: it says it is stored)
    rollouts: Callable[[RunContext, int, str], list[Rollout]]
    # (ctx, gen, task) -> the Step holding the task's result: the step is done when it is
    result: Callable[[RunContext, int, str], Step]
    # (ctx, gen, task, {rollout label: stored status}) -> the result document
    finish: Callable[[RunContext, int, str, dict[str, dict]], dict[str, Any]]
    reading: Reading = outcome_only

    def steps(self, ctx: RunContext, gen: int, task: str) -> list[Step]:
        return [self.result(ctx, gen, task)]

    def run(
        self,
        ctx: RunContext,
        gen: int,
        task: str,
        run_episode: EpisodeRunner | None = None,
        *,
        phase: str | None = None,
        endpoint: Endpoint | None = None,
        rollout: str | None = None,
        agent_ended: bool = False,
    ) -> dict:
        """One call of the step: without `phase` every missing rollout here, then the result; on the
        cluster prepare (the fan-out items), ingest (the pod at `rollout`) or finish."""
        step, driver = self.result(ctx, gen, task), Driver(ctx, reading=self.reading)
        if step.done and phase != Phase.INGEST:
            return {"task": task, "stored": True, **({"rollouts": []} if phase == Phase.PREPARE else {})}
        rs = self.rollouts(ctx, gen, task)
        if phase == Phase.PREPARE:
            if endpoint is None:
                raise ValueError("--phase prepare needs --endpoint (the model the agent pods call)")
            return {"task": task, "rollouts": [i for r in rs if (i := driver.prepare(r, endpoint)) is not None]}
        if phase == Phase.INGEST:
            if not rollout:
                raise ValueError("--phase ingest needs --rollout (a key the prepare phase listed)")
            status = driver.ingest_named(rollout, {r.prefix: (lambda r=r: r) for r in rs}, agent_ended)
            return {"task": task, "outcome": status.get("outcome")}
        if phase is None:
            if run_episode is None:
                raise ValueError("running the rollouts here needs an episode runner")
            driver.run_all(rs, run_episode)
        elif phase != Phase.FINISH:
            raise ValueError(f"--phase: expected prepare, ingest or finish, got {phase!r}")
        return {"task": task, **self._finish(ctx, gen, task, step, driver, rs)}

    def _finish(self, ctx: RunContext, gen: int, task: str, step: Step, driver: Driver, rs: list[Rollout]) -> dict:
        statuses = {r.label: driver.stored(r) for r in rs}
        if missing := [label for label, s in statuses.items() if s is None]:
            raise RolloutError(
                f"{step.name}: rollouts {missing} are not stored (their agent pods and ingest come "
                "before --phase finish)"
            )
        step.start()
        doc = self.finish(ctx, gen, task, statuses)
        key = f"{step.prefix}/{RESULT}"
        ctx.store.put_json(key, doc)
        step.finish([key])
        return doc


def declared(ref: str) -> AgentStep:
    """The AgentStep `module:NAME` names; a clear error when it names none."""
    found = referenced(ref, "--step")
    if not isinstance(found, AgentStep):
        raise ValueError(f"--step {ref}: expected an AgentStep, found {type(found).__name__}")
    return found
