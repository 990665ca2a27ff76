"""The rollout driver: the one way search, collect, evaluate and panel selection run their rollouts,
and guard its checks jobs.

A step declares its rollouts (`Rollout`: where each is stored, its request, what is stored before
its record, its manifest) and, through `Driver`, which model plays them and how an outcome is read
(`Reading`). The driver owns the rest, alike for every step: skip what is stored; run here (this
process, shell commands sandboxed); or, on the cluster, prepare an agent pod's input and its fan-out
item, then ingest what the pod left, a lost or unsigned pod as an infra_error rollout
(`rollouts.agent_result`). Both ways store the same bytes through `rollouts.store_record`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mass_jobs.episodes import rollouts
from mass_jobs.episodes.episode import EpisodeInput, EpisodeRequest
from mass_jobs.episodes.rollouts import EpisodeRunner, RolloutError
from mass_jobs.run.context import RunContext
from mass_jobs.store import Step

# (rollout, status, trace) -> (documents stored before the record, the manifest's extra)
Reading = Callable[["Rollout", dict, bytes], tuple[dict[str, Any], dict[str, Any]]]


def outcome_only(_r: Rollout, status: dict, _trace: bytes) -> tuple[dict, dict]:
    """How most steps read an outcome: nothing to add, the outcome in the manifest."""
    return {}, {"outcome": status.get("outcome")}


@dataclass(frozen=True)
class Rollout:
    """One agent run a step needs."""

    prefix: str  # its store dir
    request: EpisodeRequest
    task: str
    label: str  # the fan-out's `episode` pod label
    gen: int  # the generation whose model plays it (pod label)
    manifest: Step | None = None  # None: its stored status.json alone says it is done (search)
    first: Mapping[str, Any] = field(default_factory=dict)  # stored before its record: prompt, episode doc
    # (name, hook): the hook sees the seeded workspace before the agent and its result is stored as
    # <prefix>/<name>, before any agent runs (collect's hashes of the protected paths)
    seeded: tuple[str, Callable[[Path], Any]] | None = None


@dataclass
class Driver:
    ctx: RunContext
    executor_role: bool = True  # roles.executor plays it when set (never where a generation is measured)
    reading: Reading = outcome_only

    # ------------------------------------------------------------ what is stored
    def stored(self, r: Rollout) -> dict | None:
        """The stored rollout's status, None while it is missing."""
        store, key = self.ctx.store, self.ctx.rollout_file(r.prefix, "status.json")
        done = r.manifest.done if r.manifest is not None else store.exists(key)
        return store.get_json(key) if done else None

    # ------------------------------------------------------------ here
    def run(self, r: Rollout, run_episode: EpisodeRunner) -> dict:
        """Run the rollout here and store it (its stored status when it is stored already)."""
        if (status := self.stored(r)) is not None:
            return status
        if r.manifest is not None:
            r.manifest.start()
        with rollouts.run_here(run_episode, r.request, seeded=lambda ws: self._seeded(r, ws)) as ran:
            self._store(r, ran.status, ran.trace, ran.network, workspace=ran.workspace)
        return ran.status

    def run_all(
        self, rs: Iterable[Rollout], run_episode: EpisodeRunner, on_done: Callable[[Rollout, dict], None] | None = None
    ) -> None:
        """Every rollout not stored, `execution.concurrency` at once; the first failure is raised."""

        def one(r: Rollout) -> None:
            status = self.run(r, run_episode)
            if on_done is not None:
                on_done(r, status)

        with ThreadPoolExecutor(max_workers=max(1, self.ctx.spec.execution.concurrency)) as pool:
            list(pool.map(one, rs))

    # ------------------------------------------------------------ the cluster: agent pods
    def prepare(self, r: Rollout, endpoint) -> dict | None:
        """The agent pod's input (episode.json, the seeded workspace, a fresh key) and its fan-out
        item; None when the rollout is stored (no pod runs)."""
        if self.stored(r) is not None:
            return None
        if self.executor_role:
            endpoint = rollouts.executor_endpoint(self.ctx.spec, endpoint)
        inp = EpisodeInput.from_spec(self.ctx.spec, endpoint, r.request)
        rollouts.prepare(self.ctx, r.prefix, inp, seeded=lambda ws: self._seeded(r, ws))
        return rollouts.fanout_item(self.ctx, r.prefix, r.task, r.label, r.gen)

    def prepare_job(
        self,
        prefix: str,
        task: str,
        label: str,
        gen: int,
        document: dict,
        workspace_archive: bytes,
        outputs: tuple[str, ...],
    ) -> dict:
        """The input of an agent pod that runs something else than an episode (guard's checks job):
        its document and workspace as given, after a fresh key; its fan-out item."""
        rollouts.new_inputs(self.ctx, prefix, outputs)
        self.ctx.store.put_json(self.ctx.agent_input(prefix, "episode.json"), document)
        self.ctx.store.put_bytes(self.ctx.agent_input(prefix, "workspace.tar.gz"), workspace_archive)
        return rollouts.fanout_item(self.ctx, prefix, task, label, gen)

    def prepared(self, r: Rollout) -> list[str]:
        """The keys `prepare` wrote."""
        seeded = [self.ctx.rollout_file(r.prefix, r.seeded[0])] if r.seeded else []
        return [*rollouts.input_keys(self.ctx, r.prefix), *seeded]

    def ingest(self, r: Rollout, agent_ended: bool = False) -> dict:
        """Store what the rollout's agent pod left: its signed outputs, or, with `agent_ended` (the
        agent step is over), an infra_error rollout for a pod that left none or outputs its harness
        did not sign. A missing output while the pod may still run is an error."""
        if (status := self.stored(r)) is not None:
            return status
        if r.seeded and not self.ctx.store.exists(self.ctx.rollout_file(r.prefix, r.seeded[0])):
            raise RolloutError(
                f"rollout {r.prefix}: cannot ingest, not prepared (run --phase prepare, then the agent pod)"
            )
        status, blobs, _ = rollouts.agent_result(self.ctx, r.prefix, agent_ended)
        if r.manifest is not None:
            r.manifest.start()
        self._store(r, status, blobs["trace.jsonl"], blobs.get(rollouts.NETWORK), archive=blobs["workspace.tar.gz"])
        return status

    def ingest_named(self, rel: str, declared: Mapping[str, Callable[[], Rollout]], agent_ended: bool = False) -> dict:
        """`ingest` of the rollout named by `--rollout REL` (a key relative to the run), among the
        step's own (prefix -> its declaration, made only for the one named)."""
        return self.ingest(declared[rollouts.find_rollout(self.ctx, rel, list(declared))](), agent_ended)

    # ------------------------------------------------------------ storing
    def _seeded(self, r: Rollout, workspace: Path) -> None:
        if r.seeded:
            name, hook = r.seeded
            self.ctx.store.put_json(self.ctx.rollout_file(r.prefix, name), hook(workspace))

    def _store(
        self,
        r: Rollout,
        status: dict,
        trace: bytes,
        network: bytes | None,
        *,
        workspace: Path | None = None,
        archive: bytes | None = None,
    ) -> None:
        added, extra = self.reading(r, status, trace)
        keys = rollouts.store_record(
            self.ctx,
            r.prefix,
            status=status,
            trace=trace,
            workspace=workspace,
            workspace_archive=archive,
            first={**r.first, **added},
            network=network,
        )
        if r.manifest is not None:
            seeded = [self.ctx.rollout_file(r.prefix, r.seeded[0])] if r.seeded else []
            r.manifest.finish([*seeded, *keys], extra=extra)
