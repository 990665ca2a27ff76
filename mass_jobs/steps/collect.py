"""Teacher collection: independent episodes of the elite workflow + the teacher execution directive.

    mass collect --spec S --gen G --task T                       # every missing episode, concurrently
    mass collect --spec S --gen G --task T --episode I           # one episode, here
    mass collect ... --episode I --phase prepare|ingest          # Argo: around an agent pod

`collection.episodes` episodes per training task run in a thread pool of `execution.concurrency`.
Which tasks are collected (`collection.collect_when`): by default (`elite`), as in the paper's code,
a task whose search's best version (the champion under `search.selection: champion`) beat the bare
reference, that version being the teacher's workflow; `any_version` collects when any judged version
beat it, with the latest such version. A task that is not collected is skipped and the skip recorded.
Each episode lands under `collect/<task>/ep-<i>/` (episode.json, protected.json,
workspace.tar.gz, trace.jsonl, status.json) with its own step manifest, so a rerun only redoes
missing episodes. Failed, timed-out, loop-detected and infra-error episodes are kept but ineligible.

Argo phases: `prepare` writes `ep-<i>/input/{episode.json,workspace.tar.gz}` (the agent pod's input
artifact; the pod runs `mass episode --in DIR --out DIR`) plus `ep-<i>/protected.json`, and says
whether an agent pod must run (not for a skipped task or an episode already stored); the pod's
outputs are uploaded to `ep-<i>/output/{workspace.tar.gz,trace.jsonl,status.json}`; `ingest`
validates them, promotes them to the episode's keys and writes the episode manifest. An agent pod
that failed or was killed (its retries spent) leaves no status: ingest records the episode as
`infra_error` (ineligible), so one lost pod never fails the generation. `finish` (no episode)
writes the task's summary once every episode is stored: only after it may guard and rank run.
"""

from __future__ import annotations

from typing import Any

from mass_jobs.config.errors import StepFailed
from mass_jobs.episodes import rollouts
from mass_jobs.episodes.driver import Driver, Rollout
from mass_jobs.episodes.episode import EpisodeRequest
from mass_jobs.episodes.rollouts import EpisodeRunner, Phase, RolloutError, agent_ended, derived_seed
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import roles_input
from mass_jobs.spec.workflow import teacher_directive
from mass_jobs.spec.workflow_docs import teacher_parts
from mass_jobs.steps.search_state import SearchState
from mass_jobs.steps.workspace_reads import hash_protected
from mass_jobs.store import Step, Waiting

EPISODE_FILES = ("protected.json", "episode.json", *rollouts.RECORD)


class CollectError(StepFailed):
    pass


def search_finished(ctx: RunContext, gen: int, task_id: str) -> dict | None:
    """The task's stored search state once the search finished, else None."""
    key = ctx.search_state(gen, task_id)
    doc = ctx.store.get_json(key) if ctx.store.exists(key) else None
    return doc if doc and doc.get("done") else None


def collect_steps(ctx: RunContext, gen: int, task_id: str) -> list:
    """Every episode's Step (none when the task is skipped) and the task's summary Step."""

    if search_finished(ctx, gen, task_id) is None:
        return [Waiting(f"task {task_id}: search of generation {gen} is not finished")]
    c = Collection(ctx, gen, task_id)
    episodes = [] if c.skip_reason is not None else [c.step(i) for i in range(c.cfg.episodes)]
    return [*episodes, c.summary_step()]


class Collection:
    def __init__(self, ctx: RunContext, gen: int, task_id: str, require_beats_reference: bool | None = None):
        self.ctx, self.gen, self.store = ctx, gen, ctx.store
        self.driver = Driver(ctx)
        self.task = ctx.spec.task(task_id)
        self.cfg = ctx.spec.collection
        self.single = self.cfg.teacher == "single"  # the single-agent teacher control: no delegation tool
        # The spec decides (collection.require_beats_reference); callers may override it in code.
        self.require_beats_reference = (
            self.cfg.require_beats_reference if require_beats_reference is None else require_beats_reference
        )
        if self.task.split != "train":
            raise CollectError(f"task {task_id} is a {self.task.split} task; only train tasks are collected")
        doc = search_finished(ctx, gen, task_id)
        if doc is None:
            raise CollectError(f"task {task_id}: search of generation {gen} is not finished; run `mass search` first")
        self.state = SearchState.model_validate(doc)
        self.version = self._teacher_version()
        self.workflow = next(r.workflow for r in self.state.iterations if r.k == self.version)
        directive = (
            self.cfg.directive if self.cfg.directive is not None else teacher_directive(ctx.spec.execution.harness)
        )
        self.parts = teacher_parts(self.task, self.workflow, directive)

    def _winning_version(self) -> int | None:
        """The version that qualifies the task under `collect_when`, None when none does."""
        if self.cfg.collect_when == "elite":
            return self.state.elite if self.state.beats_reference else None
        return self.state.beat_reference[-1] if self.state.beat_reference else None  # any_version

    def _teacher_version(self) -> int:
        """The iteration whose workflow the teacher runs (the elite when collection is forced)."""
        won = self._winning_version()
        return self.state.elite if won is None else won

    @property
    def skip_reason(self) -> str | None:
        if self.require_beats_reference and self._winning_version() is None:
            best = "champion" if self.state.selection == "champion" else "elite"
            if self.cfg.collect_when == "elite":
                return (
                    f"the search never produced a {best} that beat the bare reference "
                    f"(final {best}: iteration {self.state.elite}; collection.collect_when: elite)"
                )
            return (
                f"the search never produced a version that beat the bare reference "
                f"(no version was preferred over it; final {best}: iteration {self.state.elite})"
            )
        return None

    def prefix(self, i: int) -> str:
        return self.ctx.collect_episode(self.gen, self.task.id, i)

    def file(self, i: int, name: str) -> str:
        return self.ctx.episode_file(self.gen, self.task.id, i, name)

    def episode_doc(self, i: int) -> dict:
        """What defines episode i (its step inputs, and the agent pod's episode.json minus the endpoint)."""

        s = self.ctx.spec
        return {
            "task": self.task.id,
            "gen": self.gen,
            "index": i,
            "prompt": self.parts.text,
            "prompt_parts": {
                "task": self.parts.task,
                "workflow": self.parts.workflow,
                "directive": self.parts.directive,
                # an upstream block's rules that name agents: stripped with it (absent otherwise)
                **({"agent_rules": list(self.parts.agent_rules)} if self.parts.agent_rules else {}),
            },
            "elite_iteration": self.version,
            "seed": derived_seed(s.search.seed, self.task.id, self.gen, "collect", i),
            "files": self.task.files,
            "harness": s.execution.harness,
            **({"network": self.task.network} if self.task.network else {}),  # the task's own hosts
            "limits": s.execution.limits.as_input(),
            "sampling": s.model.sampling.model_dump(mode="json"),
            # only a single-agent teacher says so: the team's episode inputs (and their manifests) stay as they were
            **({"teacher": "single"} if self.single else {}),
            **({"executor": roles_input(s)["executor"]} if s.roles.executor else {}),  # roles.executor played it
        }

    def step(self, i: int):

        return Step(self.store, self.prefix(i), self.episode_doc(i), name=f"collect/{self.task.id}/ep-{i}")

    # ------------------------------------------------------------ one episode, by the rollout driver
    def rollout(self, i: int) -> Rollout:
        doc = self.episode_doc(i)
        request = EpisodeRequest(
            prompt=doc["prompt"],
            files=dict(self.task.files),
            seed=doc["seed"],
            single_agent=self.single,
            network=tuple(self.task.network),
        )
        # the protected paths' hashes of the seeded workspace, before the agent sees it (guard compares)
        protect = ("protected.json", lambda ws: hash_protected(ws, self.task.guards.protected_paths))
        return Rollout(
            self.prefix(i),
            request,
            self.task.id,
            f"ep-{i}",
            self.gen,
            manifest=self.step(i),
            first={"episode.json": doc},
            seeded=protect,
        )

    # ------------------------------------------------------------ the task
    def summary_step(self):

        return Step(
            self.store,
            self.ctx.collect(self.gen, self.task.id),
            {"episodes": self.cfg.episodes, "skip": self.skip_reason, "elite": self.workflow},
            name=f"collect/{self.task.id}",
        )

    def summarize(self) -> dict:
        """collect/<task>/summary.json once every episode is stored (or the skip)."""
        key = self.ctx.collect_summary(self.gen, self.task.id)
        reason = self.skip_reason
        summary: dict[str, Any] = {
            "task": self.task.id,
            "gen": self.gen,
            "skipped": reason is not None,
            "reason": reason,
            "elite_iteration": self.version,
            "collect_when": self.cfg.collect_when,
            "beat_reference": self.state.beat_reference,
            "beats_reference": self.state.beats_reference,
            "episodes": [],
            "eligible": [],
        }
        if reason is None:
            for i in range(self.cfg.episodes):
                if not self.step(i).done:
                    raise CollectError(f"task {self.task.id}: episode {i} is not collected yet")
                status = self.store.get_json(self.file(i, "status.json"))
                summary["episodes"].append(
                    {"id": f"ep-{i}", "outcome": status.get("outcome"), "reason": status.get("reason", "")}
                )
            summary["eligible"] = [e["id"] for e in summary["episodes"] if self.cfg.rankable(e["outcome"])]
        step = self.summary_step()
        step.start()
        self.store.put_json(key, summary)
        step.finish([key], extra={"skipped": summary["skipped"], "eligible": len(summary["eligible"])})
        return summary


def run_collect(
    ctx: RunContext,
    gen: int,
    task_id: str,
    run_episode: EpisodeRunner | None,
    *,
    episode: int | None = None,
    phase: str | Phase | None = None,
    endpoint=None,
    require_beats_reference: bool | None = None,
    agent_status: str | None = None,
) -> dict:
    """Library core of `mass collect` and the local runner; returns the summary (or the one episode's status)."""
    c = Collection(ctx, gen, task_id, require_beats_reference)
    phase = rollouts.phase_of(phase, step="collect")
    if phase is Phase.FINISH:
        if episode is not None:
            raise CollectError("--phase finish is per task: drop --episode")
        return c.summarize()
    if episode is not None:
        if not 0 <= episode < c.cfg.episodes:
            raise CollectError(f"--episode must be in 0..{c.cfg.episodes - 1} (collection.episodes), got {episode}")
        if c.skip_reason:  # (prepare: no agent pod)
            return {
                "skipped": True,
                "reason": c.skip_reason,
                "agent": False,
                **({"rollout": ctx.relative(c.prefix(episode))} if phase is Phase.PREPARE else {}),
            }
        r = c.rollout(episode)
        if phase is Phase.PREPARE:
            if endpoint is None:
                raise CollectError("--phase prepare needs the model endpoint the agent pod will call (--endpoint)")
            # stored already (a resumed workflow): no agent pod
            item = c.driver.prepare(r, endpoint)
            return {
                "prepared": c.driver.prepared(r) if item else [],
                "agent": item is not None,
                "rollout": ctx.relative(r.prefix),
            }
        if phase is Phase.INGEST:
            try:
                return c.driver.ingest(r, agent_ended=agent_ended(agent_status))
            except RolloutError as e:
                raise CollectError(str(e).replace(f"rollout {r.prefix}", f"episode {r.prefix}")) from None
        assert run_episode is not None
        return c.driver.run(r, run_episode)
    if c.skip_reason is None:
        todo = [c.rollout(i) for i in range(c.cfg.episodes)]
        assert run_episode is not None or all(c.driver.stored(r) is not None for r in todo)
        c.driver.run_all(todo, run_episode)
    return c.summarize()
