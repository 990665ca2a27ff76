"""An agent step the package does not ship, declared here and nowhere else (tests/test_agent_step.py):
per training task, two rollouts of the task's prompt by the generation's model, read for their outcome
and trace length, and a result listing them. `PIPELINE` is a pipeline of that step alone."""

from __future__ import annotations

from mass_jobs.episodes.agent_step import AgentStep
from mass_jobs.episodes.driver import Rollout
from mass_jobs.episodes.episode import EpisodeRequest
from mass_jobs.pipeline.table import agent_step
from mass_jobs.store import Step

REPLICATES = 2
REF = "tests.probe_step:PROBE"


def where(ctx, gen: int, task: str, rest: str) -> str:
    return ctx.under_run(f"gen-{gen}/probe/{task}/{rest}")


def rollouts(ctx, gen: int, task: str) -> list[Rollout]:
    t = ctx.spec.task(task)
    out = []
    for i in range(REPLICATES):
        prefix = where(ctx, gen, task, f"rep-{i}")
        manifest = Step(
            ctx.store,
            prefix,
            {"task": t.model_dump(mode="json", include={"prompt", "files"}), "rep": i},
            name=f"probe gen-{gen} {task} rep-{i}",
        )
        request = EpisodeRequest(prompt=t.prompt, files=dict(t.files), seed=1000 + i, network=tuple(t.network))
        out.append(Rollout(prefix, request, task, f"rep-{i}", gen, manifest=manifest, first={"prompt.txt": t.prompt}))
    return out


def result(ctx, gen: int, task: str) -> Step:
    return Step(
        ctx.store,
        where(ctx, gen, task, "result"),
        {"task": task, "replicates": REPLICATES},
        name=f"probe gen-{gen} {task}",
    )


def finish(ctx, gen: int, task: str, statuses: dict[str, dict]) -> dict:
    return {"task": task, "outcomes": {label: s.get("outcome") for label, s in sorted(statuses.items())}}


def reading(r: Rollout, status: dict, trace: bytes) -> tuple[dict, dict]:
    return {}, {"outcome": status.get("outcome"), "trace_lines": trace.count(b"\n")}


PROBE = AgentStep(rollouts=rollouts, result=result, finish=finish, reading=reading)
PIPELINE = (agent_step("probe", REF),)
