"""Teacher collection: independent episodes of the elite workflow + the teacher execution directive.

    mass collect --spec S --gen G --task T                       # every missing episode, concurrently
    mass collect --spec S --gen G --task T --episode I           # one episode, here
    mass collect ... --episode I --phase prepare|ingest          # Argo: around an agent pod

`collection.episodes` episodes per training task run in a thread pool of `execution.concurrency`.
A task whose search never produced an elite that beat the bare reference is skipped and the skip
recorded. Each episode lands under `collect/<task>/ep-<i>/` (episode.json, protected.json,
workspace.tar.gz, trace.jsonl, status.json) with its own step manifest, so a rerun only redoes
missing episodes. Failed, timed-out, loop-detected and infra-error episodes are kept but ineligible.

Argo phases: `prepare` writes `ep-<i>/input/{episode.json,workspace.tar.gz}` (the agent pod's input
artifact; the pod runs `mass episode --in DIR --out DIR`) plus `ep-<i>/protected.json`; the pod's
outputs are uploaded to `ep-<i>/output/{workspace.tar.gz,trace.jsonl,status.json}`; `ingest`
validates them, promotes them to the episode's keys and writes the episode manifest.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mass_jobs.context import RunContext
from mass_jobs.errors import StepFailed
from mass_jobs.steps.guard import hash_protected
from mass_jobs.steps.search import Execute, SearchState, derived_seed
from mass_jobs.workflow import teacher_prompt_parts

EPISODE_FILES = ("episode.json", "protected.json", "workspace.tar.gz", "trace.jsonl", "status.json")


class CollectError(StepFailed):
    pass


class Collection:
    def __init__(self, ctx: RunContext, gen: int, task_id: str, require_beats_reference: bool | None = None):
        self.ctx, self.gen, self.store = ctx, gen, ctx.store
        self.task = ctx.spec.task(task_id)
        self.cfg = ctx.spec.collection
        # The spec decides (collection.require_beats_reference); callers may override it in code.
        self.require_beats_reference = (
            self.cfg.require_beats_reference if require_beats_reference is None else require_beats_reference
        )
        if self.task.split != "train":
            raise CollectError(f"task {task_id} is a {self.task.split} task; only train tasks are collected")
        doc = self.store.get_json(ctx.search_state(gen, task_id)) if self.store.exists(ctx.search_state(gen, task_id)) else None
        if doc is None or not doc.get("done"):
            raise CollectError(f"task {task_id}: search of generation {gen} is not finished; run `mass search` first")
        self.state = SearchState.model_validate(doc)
        self.parts = teacher_prompt_parts(self.task.prompt, _wf(self.state.elite_workflow), self.cfg.directive)

    @property
    def skip_reason(self) -> str | None:
        if self.require_beats_reference and not self.state.beats_reference:
            return (f"the search never produced an elite that beat the bare reference "
                    f"(elite: iteration {self.state.elite})")
        return None

    def prefix(self, i: int) -> str:
        return self.ctx.collect_episode(self.gen, self.task.id, i)

    def episode_doc(self, i: int) -> dict:
        """What defines episode i (its step inputs, and the agent pod's episode.json minus the endpoint)."""
        s = self.ctx.spec
        return {
            "task": self.task.id, "gen": self.gen, "index": i,
            "prompt": self.parts.text,
            "prompt_parts": {"task": self.parts.task, "workflow": self.parts.workflow, "directive": self.parts.directive},
            "elite_iteration": self.state.elite,
            "seed": derived_seed(s.search.seed, self.task.id, self.gen, "collect", i),
            "files": self.task.files, "harness": s.execution.harness,
            "limits": s.execution.limits.model_dump(mode="json"), "sampling": s.model.sampling.model_dump(mode="json"),
        }

    def step(self, i: int):
        from mass_jobs.store import Step

        return Step(self.store, self.prefix(i), self.episode_doc(i), name=f"collect/{self.task.id}/ep-{i}")

    # ------------------------------------------------------------ local episodes
    def run_episode(self, i: int, execute: Execute) -> dict:
        step = self.step(i)
        if step.done:
            return self.store.get_json(f"{self.prefix(i)}/status.json")
        step.start()
        doc, p = self.episode_doc(i), self.prefix(i)
        with tempfile.TemporaryDirectory(prefix="mass-collect-") as tmp:
            workspace, out = Path(tmp) / "workspace", Path(tmp) / "out"
            out.mkdir()
            self._seed(workspace)
            self.store.put_json(f"{p}/protected.json", hash_protected(workspace, self.task.guards.protected_paths))
            self.store.put_json(f"{p}/episode.json", doc)
            status = execute(doc["prompt"], self.task.files, workspace, out, doc["seed"])
            self.store.put_dir(f"{p}/workspace.tar.gz", workspace)
            trace = out / "trace.jsonl"
            self.store.put_bytes(f"{p}/trace.jsonl", trace.read_bytes() if trace.exists() else b"")
            self.store.put_json(f"{p}/status.json", status)
        step.finish([f"{p}/{n}" for n in EPISODE_FILES], extra={"outcome": status.get("outcome")})
        return status

    def _seed(self, workspace: Path) -> None:
        from mass_jobs.harness import seed_workspace

        seed_workspace(workspace, self.task.files)

    # ------------------------------------------------------------ Argo phases
    def prepare(self, i: int, endpoint) -> list[str]:
        """The agent pod's input (episode.json in `mass episode`'s format, seeded workspace)."""
        from mass_jobs.harness import EpisodeInput, episode_file_json

        p, doc, s = self.prefix(i), self.episode_doc(i), self.ctx.spec
        inp = EpisodeInput(prompt=doc["prompt"], endpoint=endpoint, limits=s.execution.limits,
                           sampling=s.model.sampling, harness=s.execution.harness, seed=doc["seed"],
                           files=dict(self.task.files))
        with tempfile.TemporaryDirectory(prefix="mass-prepare-") as tmp:
            workspace = Path(tmp) / "workspace"
            self._seed(workspace)
            self.store.put_json(f"{p}/protected.json", hash_protected(workspace, self.task.guards.protected_paths))
            self.store.put_json(f"{p}/input/episode.json", episode_file_json(inp))
            self.store.put_dir(f"{p}/input/workspace.tar.gz", workspace)
        return [f"{p}/input/episode.json", f"{p}/input/workspace.tar.gz", f"{p}/protected.json"]

    def ingest(self, i: int) -> dict:
        from mass_jobs.harness import validate_status

        step = self.step(i)
        p = self.prefix(i)
        if step.done:
            return self.store.get_json(f"{p}/status.json")
        missing = [n for n in ("workspace.tar.gz", "trace.jsonl", "status.json") if not self.store.exists(f"{p}/output/{n}")]
        if missing or not self.store.exists(f"{p}/protected.json"):
            raise CollectError(f"episode {p}: cannot ingest, missing {missing or ['protected.json']} "
                               f"(run --phase prepare, then the agent pod)")
        status = self.store.get_json(f"{p}/output/status.json")
        validate_status(status)
        step.start()
        self.store.put_json(f"{p}/episode.json", self.episode_doc(i))
        for name in ("workspace.tar.gz", "trace.jsonl", "status.json"):
            self.store.put_bytes(f"{p}/{name}", self.store.get_bytes(f"{p}/output/{name}"))
        step.finish([f"{p}/{n}" for n in EPISODE_FILES], extra={"outcome": status.get("outcome")})
        return status

    # ------------------------------------------------------------ the task
    def summarize(self) -> dict:
        """collect/<task>/summary.json once every episode is stored (or the skip)."""
        from mass_jobs.store import Step

        key = self.ctx.collect_summary(self.gen, self.task.id)
        reason = self.skip_reason
        summary: dict[str, Any] = {"task": self.task.id, "gen": self.gen, "skipped": reason is not None,
                                   "reason": reason, "elite_iteration": self.state.elite,
                                   "beats_reference": self.state.beats_reference, "episodes": [], "eligible": []}
        if reason is None:
            for i in range(self.cfg.episodes):
                if not self.step(i).done:
                    raise CollectError(f"task {self.task.id}: episode {i} is not collected yet")
                status = self.store.get_json(f"{self.prefix(i)}/status.json")
                summary["episodes"].append({"id": f"ep-{i}", "outcome": status.get("outcome"),
                                            "reason": status.get("reason", "")})
            summary["eligible"] = [e["id"] for e in summary["episodes"] if e["outcome"] == "success"]
        step = Step(self.store, self.ctx.collect(self.gen, self.task.id),
                    {"episodes": self.cfg.episodes, "skip": reason, "elite": self.state.elite_workflow},
                    name=f"collect/{self.task.id}")
        step.start()
        self.store.put_json(key, summary)
        step.finish([key], extra={"skipped": summary["skipped"], "eligible": len(summary["eligible"])})
        return summary


def _wf(doc: dict):
    from mass_jobs.models import Workflow

    return Workflow.model_validate(doc)


def run_collect(ctx: RunContext, gen: int, task_id: str, execute: Execute | None, *, episode: int | None = None,
                phase: str | None = None, endpoint=None, require_beats_reference: bool | None = None) -> dict:
    """Library core of `mass collect` and the local runner; returns the summary (or the one episode's status)."""
    c = Collection(ctx, gen, task_id, require_beats_reference)
    if episode is not None:
        if not 0 <= episode < c.cfg.episodes:
            raise CollectError(f"--episode must be in 0..{c.cfg.episodes - 1} (collection.episodes), got {episode}")
        if c.skip_reason:
            return {"skipped": True, "reason": c.skip_reason}
        if phase == "prepare":
            if endpoint is None:
                raise CollectError("--phase prepare needs the model endpoint the agent pod will call (--endpoint)")
            return {"prepared": c.prepare(episode, endpoint)}
        if phase == "ingest":
            return c.ingest(episode)
        if phase is not None:
            raise CollectError(f"--phase must be 'prepare' or 'ingest', got {phase!r}")
        assert execute is not None
        return c.run_episode(episode, execute)
    if c.skip_reason is None:
        todo = [i for i in range(c.cfg.episodes) if not c.step(i).done]
        assert execute is not None or not todo
        with ThreadPoolExecutor(max_workers=ctx.spec.execution.concurrency) as pool:
            for _ in pool.map(lambda i: c.run_episode(i, execute), todo):
                pass
    return c.summarize()
