"""How the local runner executes a node of the compiled plan (`pipeline.nodes`).

- `InProcess` (the default): a step that declares `local` runs its core here with the services it
  names (the generation's lazy chat client, a sandboxed episode executor, servers); any other runs
  its CLI entry as a subprocess (a trainer under torchrun).
- `Argv`: every node runs as the cluster runs it, container by container: the node's argv, and for
  an agent step its phases around agent pods (prepare -> one `mass episode` per listed rollout,
  given its input artifacts and no store credential, whose outputs are uploaded as Argo's wait
  container would -> ingest, told how the episode ended -> finish). Models are served here where
  the cluster has InferenceServices. A run under it stores what an in-process run stores
  (tests/test_run_e2e.py), so the phases a cluster runs are exercised on one machine.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mass_jobs.episodes import proof
from mass_jobs.episodes.rollouts import ROLLOUTS_OUTPUT, ROUNDS_OUTPUT, episode_runner, executor_endpoint
from mass_jobs.pipeline import nodes as N
from mass_jobs.pipeline import table as P
from mass_jobs.pipeline.progress import PerKey
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.roles import client_for
from mass_jobs.serving.servers import ServeJudge, ServeModel

HANDLERS = ("in-process", "argv")
# every file an agent pod reads, and may upload, whether it runs an episode or a checks job
POD_INPUTS = ("episode.json", "workspace.tar.gz", proof.KEY)
POD_OUTPUTS = (*proof.EPISODE_OUTPUTS, *proof.CHECK_OUTPUTS, proof.PROOF)
# what an agent pod never holds: store credentials, API keys, tokens
_SECRET = re.compile(r"^AWS_|KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


@dataclass(frozen=True)
class Services:
    """All a handler may use of the run, as kfp's task handlers get their command and environment
    alone: it never holds the runner."""

    ctx: RunContext
    endpoint: Callable[[], Endpoint]  # the generation's model, served on first use
    servers: Callable[[], tuple[ServeModel, ServeJudge]]  # any generation's model, the spec's judges
    mass: Callable[..., bool]  # one CLI entry as a subprocess: mass(*argv, env=, check=, label=)
    torchrun: Callable[[list[str]], None]  # a trainer's CLI entry under torchrun
    env: Callable[[], dict]  # the environment the runner's subprocesses get
    work: Path  # the run's work dir (logs, outputs, agent scratch)
    note: Callable[..., None]  # a progress line: note(text, n, of=None)

    @property
    def spec(self):
        return self.ctx.spec


def handler(name: str):
    if name not in HANDLERS:
        raise ValueError(f"handler: expected one of {HANDLERS}, got {name!r}")
    return InProcess() if name == "in-process" else Argv()


class LazyClient:
    """A chat client made on the first call, so a fully stored step never serves a model."""

    def __init__(self, make):
        self._make, self._client = make, None

    def chat(self, *args, **kwargs):
        if self._client is None:
            self._client = self._make()
        return self._client.chat(*args, **kwargs)


class InProcess:
    name = "in-process"

    def __init__(self):
        self._lock = threading.Lock()
        self._now = {"label": "", "episodes": 0, "of": None}

    def run(self, group: N.Group, services: Services) -> None:
        self.services = services
        (self._cli if group.step.local is None else self._in_process)(group)

    # ------------------------------------------------------------ services
    @property
    def client(self):
        return LazyClient(lambda: client_for(self.services.spec, self.services.endpoint()))

    def run_episode(self, *args):
        # roles.executor set: the generation's server is not needed (and not started) for episodes
        endpoint = executor_endpoint(self.services.spec, None) or self.services.endpoint()
        status = episode_runner(self.services.spec, endpoint)(*args)
        with self._lock:  # collect runs episodes concurrently
            self._now["episodes"] += 1
            self.services.note(
                f"{self._now['label']}: episode {self._now['episodes']}", self._now["episodes"], self._now["of"]
            )
        return status

    def _in_process(self, group: N.Group) -> None:
        """A step that declares `local`: its core here, per task or once, with the services it names."""
        s, g = group.step, group.gen
        with self._services(s, g) as services:
            if not s.per_task:
                s.call_local(self.services.ctx, g, None, services)
                return
            # episodes a task may still run: search = reference + initial elite + one per iteration
            of = (
                self.services.spec.search.iterations + 2
                if isinstance(s.shape, P.Recursion)
                else self.services.spec.collection.episodes
                if isinstance(s.shape, P.EpisodeFanout)
                else None
            )
            for i, node in enumerate(group.nodes):
                self._now.update(label=f"{s.name} task {i + 1}/{len(group.nodes)} {node.task}", episodes=0, of=of)
                self.services.note(self._now["label"], i, len(group.nodes))
                s.call_local(self.services.ctx, g, node.task, services)

    @contextlib.contextmanager
    def _services(self, s: P.StepDef, g: int):
        """The services a step declares. Servers of named generations (and judges) are started on
        first use and shared by the step's calls: rollouts and self-verdicts of one generation share
        a server (each start costs seconds); all are stopped when the step ends."""
        services: dict = {"client": self.client, "run_episode": self.run_episode, "progress": self._progress()}
        with contextlib.ExitStack() as servers:
            if {"serve_generation", "serve_judge"} & set(s.local or ()):
                serve_generation, serve_judge = self.services.servers()
                started: dict[int, object] = {}

                @contextlib.contextmanager
                def serve_once(h: int):
                    if h not in started:
                        started[h] = servers.enter_context(serve_generation(h))
                    yield started[h]

                services.update(serve_generation=serve_once, serve_judge=serve_judge)
            yield services

    def _progress(self) -> Callable[[str, dict], None]:
        """A progress line per record a core reports (kind: rollout, verdict, ...), counted per kind
        and generation."""
        counts = PerKey()

        def note(kind: str, rec: dict) -> None:
            n = counts.add((kind, rec.get("gen")))
            where = " ".join(f"{k} {rec[k]}" for k in ("gen", "task", "replicate", "judge") if k in rec)
            self.services.note(f"{kind} {n}: {where}", n)

        return note

    def _cli(self, group: N.Group) -> None:
        """A step without `local`: its CLI entry per node (a trainer under torchrun)."""
        for node in group.nodes:
            if isinstance(node.shape, P.Trainer):  # the train core checks the split itself (split_guard), on Argo too
                self.services.torchrun(node.argv)
            else:
                self.services.mass(*node.argv)


class Argv:
    name = "argv"

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0

    def run(self, group: N.Group, services: Services) -> None:
        self.services = services
        for node in group.nodes:
            self.node(node)

    def node(self, n: N.Node) -> None:
        """One node as the cluster runs it: its phases' command lines (`nodes.phases`), in order."""
        match n.shape:
            case P.Trainer():
                self.services.torchrun(n.phases().run)
            case P.Recursion():  # iteration 0: the reference and initial workflow
                for k in range(self.services.spec.search.iterations + 1):
                    self.phased(n, item=k, model=self.model(n))
            case P.EpisodeFanout():
                self.fan_out([lambda e=e: self.episode(n, e) for e in range(self.services.spec.collection.episodes)])
                self.services.mass(*n.phases().last)
            case P.GenerationRollouts():
                self.generation_rollouts(n)
            case _:
                self.phased(n, model=self.model(n))

    # ------------------------------------------------------------ the cluster's shapes, here
    def model(self, n: N.Node) -> list[str]:
        """The generation's model as a node that calls it is told (the cluster: its InferenceService)."""
        if not n.step.model:
            return []
        endpoint = self.services.endpoint()
        return N.model_flags(endpoint.base_url, endpoint.model)

    def phased(self, n: N.Node, *, rolls: bool = True, finish: bool = True, **given) -> None:
        """Its one command; or prepare (lists the rollouts) -> an agent per rollout -> ingest each ->
        finish. An evaluate round runs the first part where it rolls out, the finish where it judges."""
        if (run := n.phases(**given).run) is not None:
            self.services.mass(*run)
            return
        items = []
        if rolls:
            with self.outputs() as out:
                self.services.mass(*n.phases(outputs=str(out), **given).prepare)
                items = json.loads((out / ROLLOUTS_OUTPUT).read_text())

        def one(item: dict) -> None:
            status = self.agent(item["rollout"], label=f"{n.step.name} {item.get('label', '')}")
            with self.outputs() as out:
                self.services.mass(
                    *n.phases(agent_status=status, outputs=str(out), rollout=item["rollout"], **given).ingest
                )

        self.fan_out([lambda item=item: one(item) for item in items])
        if finish:
            self.services.mass(*n.phases(**given).finish)

    def episode(self, n: N.Node, e: int) -> None:
        """One collect episode: prepare says whether an agent must run and where its artifacts are."""
        with self.outputs() as out:
            self.services.mass(*n.phases(item=e, model=self.model(n), outputs=str(out)).prepare)
            if (out / "agent").read_text().strip() != "true":
                return
            rollout = (out / "rollout").read_text().strip()
        status = self.agent(rollout, label=f"{n.step.name} {n.task}")
        with self.outputs() as out:
            self.services.mass(*n.phases(item=e, agent_status=status, outputs=str(out)).ingest)

    def generation_rollouts(self, n: N.Node) -> None:
        """evaluate: plan -> its rounds in order, each a served model (its rollouts, its self-verdicts,
        its server stopped) -> finish, the spec's local judges served for it."""
        with self.outputs() as out:
            self.services.mass(*n.phases(outputs=str(out)).plan)
            rounds = json.loads((out / ROUNDS_OUTPUT).read_text())
        serve_generation, serve_judge = self.services.servers()
        for r in rounds:
            h = int(r["gen"])
            with serve_generation(h) as e:
                self.phased(
                    n,
                    model=N.round_flags(h, e.base_url, e.model),
                    rolls=r["rolls"] == "true",
                    finish=r["judges"] == "true",
                )
        with contextlib.ExitStack() as servers:
            judges = []
            for judge in self.services.spec.judges:
                if judge.endpoint == "local" and not n.done(self.services.ctx):
                    e = servers.enter_context(serve_judge(judge))
                    judges += ["--judge-endpoint", judge.name, e.base_url, e.model]
            self.services.mass(*n.phases().last, *judges)

    def agent(self, rollout: str, label: str) -> str:
        """One agent pod: its input artifacts in, `mass episode` with no store credential, its
        outputs uploaded; the phase Argo would give ingest."""
        ctx = self.services.ctx
        prefix = ctx.under_run(rollout)
        with tempfile.TemporaryDirectory(prefix="mass-agent-", dir=self.services.work) as tmp:
            in_dir, out_dir = Path(tmp) / "in", Path(tmp) / "out"
            in_dir.mkdir()
            out_dir.mkdir()
            for name in POD_INPUTS:
                if ctx.store.exists(key := ctx.agent_input(prefix, name)):
                    ctx.store.get_file(key, in_dir / name)
            ok = self.services.mass(
                *N.agent(str(in_dir), str(out_dir)),
                env=without_secrets(self.services.env()),
                check=False,
                label="agent-episode",
            )
            for name in POD_OUTPUTS:
                if (out_dir / name).is_file():
                    ctx.store.put_file(ctx.agent_output(prefix, name), out_dir / name)
        with self._lock:
            self._count += 1
            self.services.note(f"{label}: agent {self._count}", self._count)
        return "Succeeded" if ok else "Failed"

    @contextlib.contextmanager
    def outputs(self):
        """The `--outputs DIR` a step container writes its output parameters to."""
        self.services.work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="outputs-", dir=self.services.work) as tmp:
            yield Path(tmp)

    def fan_out(self, calls: list[Callable[[], None]]) -> None:
        """A fan-out, `execution.concurrency` at once (the cluster: the chart's agent parallelism)."""
        with ThreadPoolExecutor(
            max_workers=max(1, min(self.services.spec.execution.concurrency, len(calls) or 1))
        ) as pool:
            for f in [pool.submit(c) for c in calls]:
                f.result()


def without_secrets(env: dict) -> dict:
    """The environment an agent pod gets: no store credential, API key or token."""
    return {k: v for k, v in env.items() if not _SECRET.search(k)}
