"""The pipeline, spelled once: every step of a MASS run, in order, with what each one needs.

The compiled plan (`pipeline.nodes`: every node of a run, with its container's argv) is expanded
from `PIPELINE`, and the local runner (`mass run`), `mass status`, `mass plan` and the Argo compiler
(`mass render argo`) read that; adding a step is one `StepDef` here plus its core (and its CLI entry).

- `scope`: how often the step runs: once per `run`, per `generation`, per training `task`, per
  task and search `iteration` (Argo: bounded recursion), per task and `episode` (Argo: a fan-out
  of prepare -> sandboxed agent pod -> ingest, then the task's summary).
- `core`: the pure core the CLI entry and the local runner call (a function; "module:function" for
  a step defined outside the package).
- `entry` + `args`: the `mass` CLI entry the Argo container runs (`--spec`, `--gen`, `--task` are
  added by scope; `{gen}` in args is the generation the step works on).
- `reads` / `writes`: `RunContext` methods naming the store keys (the context owns the layout).
- `steps`: the function giving the Steps that hold the step's output for (ctx, gen[, task]):
  the core's own Steps, whose inputs are hashed. Done is one generic check for every step: each
  Step's manifest has its input hash and intact outputs. A Step that cannot be formed yet (an input
  not stored) is a `Waiting` value, pending with its reason, never an exception.
- `pod`: `step` (CPU pod with store credentials), `agent`: every episode the step runs is one
  agent pod (`mass episode`: sandboxed, artifacts only, no credential, no token), in one shape:
  `--phase prepare` (step pod: writes the pods' inputs, lists them) -> agent pod per episode ->
  `--phase ingest` (step pod: validates and stores its output); by scope: `episode` (collect) one
  episode per prepare, then `--phase finish`; `iteration` (search) the iteration's rollouts,
  then `--phase finish` judges and saves it; `task` (guard) a checks job per episode (its check
  commands run the model's code), then `--phase finish`; `generation` (evaluate) its rollouts against the
  InferenceServices prepare names (created before, deleted after), then `--phase finish`. The local
  runner runs the same episodes in-process (shell commands sandboxed) through the step's core.
  `trainer`: a PyTorchJob (locally: torchrun). Scope and pod together are the step's typed
  `shape` (`SHAPES`); a pair with no shape is refused when the step is declared.
- `model`: calls the generation's served model (Argo: the InferenceService; locally: one lazy
  server for all such steps of a generation, stopped after the last of them).
- `gen_offset`: the generation the step's `--gen` names relative to the cycle's (evaluate: g+1).
- `local`: how the local runner calls the core in-process: the services it takes after
  (ctx, gen[, task]) from `SERVICES`; None runs the CLI entry as a subprocess, as a container would.
- `resources`: the cluster settings' pod size the step's container gets (`step`, or `merge`: the
  merge loads the whole model in memory).
- `cost(work)`: `mass plan`'s cost model: seconds one unit takes, units, and judge calls after
  them, from the generation's counts and timings (`Work`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from mass_jobs.config.errors import StepFailed
from mass_jobs.config.references import referenced
from mass_jobs.episodes.agent_step import declared
from mass_jobs.pipeline.costs import Cost, Work, collect_cost, evaluate_cost, rank_cost, search_cost, train_cost
from mass_jobs.pipeline.shapes import (
    SHAPES,
    Shape,
)
from mass_jobs.pipeline.shapes import (
    Container as Container,
)
from mass_jobs.pipeline.shapes import (
    EpisodeFanout as EpisodeFanout,
)
from mass_jobs.pipeline.shapes import (
    GenerationRollouts as GenerationRollouts,
)
from mass_jobs.pipeline.shapes import (
    Recursion as Recursion,
)
from mass_jobs.pipeline.shapes import (
    TaskFanout as TaskFanout,
)
from mass_jobs.pipeline.shapes import (
    TaskRollouts as TaskRollouts,
)
from mass_jobs.pipeline.shapes import (
    Trainer as Trainer,
)
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import model_uri
from mass_jobs.spec.overrides import spec_flags
from mass_jobs.steps import collect, evaluate, guard, merge, rank, render_sft, report, search, select, train
from mass_jobs.store import MissingKey, UnreadableObject, Waiting

SCOPES = ("run", "generation", "task", "iteration", "episode")
PODS = ("step", "agent", "trainer")  # a CPU step pod, sandboxed agent pods, a PyTorchJob
PER_TASK = ("task", "iteration", "episode")
# what the local runner hands a core in-process: the generation's chat model, an agent-episode
# executor, servers of the generations and judges the step names itself, a progress callback
SERVICES = ("client", "run_episode", "serve_generation", "serve_judge", "progress")
RESOURCES = ("step", "merge")


@dataclass(frozen=True)
class StepDef:
    name: str
    scope: str
    core: Callable | str
    entry: tuple[str, ...]
    steps: Callable | str
    args: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    pod: str = "step"
    model: bool = False
    gen_offset: int = 0
    detail: Callable[[RunContext, int], str] | None = None
    local: tuple[str, ...] | None = None
    resources: str = "step"
    cost: Callable[[Work], Cost] | None = None

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"step {self.name}: scope must be one of {SCOPES}, got {self.scope!r}")
        if self.pod not in PODS:
            raise ValueError(f"step {self.name}: pod must be one of {PODS}, got {self.pod!r}")
        if (self.scope, self.pod) not in SHAPES:
            fits = sorted(sc for sc, pod in SHAPES if pod == self.pod)
            raise ValueError(
                f"step {self.name}: a {self.pod!r} pod runs at scope {' or '.join(fits)}, not {self.scope!r}"
            )
        if self.resources not in RESOURCES:
            raise ValueError(f"step {self.name}: resources must be one of {RESOURCES}, got {self.resources!r}")
        unknown = [n for n in (self.local or ()) if n not in SERVICES]
        if unknown:
            raise ValueError(f"step {self.name}: local services must be among {SERVICES}, got {unknown}")
        for key in (*self.reads, *self.writes):
            if not callable(getattr(RunContext, key, None)):
                raise ValueError(f"step {self.name}: {key!r} is not a RunContext key method")

    @property
    def per_task(self) -> bool:
        return self.scope in PER_TASK

    @property
    def shape(self) -> Shape:
        """What the step becomes in an executor (its scope and pod, typed)."""
        return SHAPES[(self.scope, self.pod)]

    def core_function(self) -> Callable:
        return _resolve(self.core)

    def _args(self, ctx: RunContext, gen: int, task: str | None) -> list:
        """(ctx, gen[, task]) as the core and its Steps take them (gen: the step's own generation)."""
        args = [ctx] if self.scope == "run" else [ctx, gen + self.gen_offset]
        return [*args, task] if self.per_task else args

    def argv(self, spec: str, gen, task: str | None = None) -> list[str]:
        """The CLI entry's argv after `mass` for one call (gen is the cycle's generation); a spec given
        with overrides (spec/overrides.py) hands them on."""
        if self.scope == "run":
            return [*self.entry, *spec_flags(spec), *self.args]
        g = gen + self.gen_offset if isinstance(gen, int) else gen
        out = [*self.entry, *spec_flags(spec), "--gen", str(g)]
        if self.per_task:
            out += ["--task", str(task)]
        return out + [a.replace("{gen}", str(g)) for a in self.args]

    def call_local(self, ctx: RunContext, gen: int, task: str | None, services: dict):
        """The core in-process, with the services it declares (`local`)."""
        return self.core_function()(*self._args(ctx, gen, task), *(services[n] for n in self.local or ()))

    def work(self, w: Work) -> Cost:
        """`mass plan`'s estimate; a step without a cost model is one fixed unit (per task, per task)."""
        if self.cost is not None:
            return self.cost(w)
        return Cost(w.timings["fixed_s"], w.n_train if self.per_task else 1)

    def stored(self, ctx: RunContext, gen: int, task: str | None = None) -> list:
        """The Steps holding this step's output (a `Waiting` where one cannot be formed yet).

        An input that is stored but damaged (gone since listed, unreadable, of another shape, or
        refused by the core with its StepFailed) is waiting too, for the step that rewrites it; any
        other error is a bug and propagates, since reading it as pending would rerun GPU steps on
        every cycle."""
        from pydantic import ValidationError

        try:
            out = _resolve(self.steps)(*self._args(ctx, gen, task))
        except (MissingKey, UnreadableObject, ValidationError, StepFailed) as err:
            return [Waiting(f"an input is damaged: {err}")]
        return list(out) if isinstance(out, list | tuple) else [out]

    def done(self, ctx: RunContext, gen: int, task: str | None = None) -> bool:
        return all(s.done for s in self.stored(ctx, gen, task))

    def is_done(self, ctx: RunContext, gen: int, tasks: list[str]) -> bool:
        if self.per_task:
            return all(self.done(ctx, gen, t) for t in tasks)
        return self.done(ctx, gen)


def _resolve(ref: Callable | str) -> Callable:
    if callable(ref):
        return ref
    if not callable(found := referenced(ref, f"step function {ref}")):
        raise ValueError(f"step function {ref}: expected a function, found {type(found).__name__}")
    return found


def _checkpoints(ctx: RunContext, g: int) -> str:
    n = len([k for k in ctx.store.list(ctx.train_checkpoints(g)) if "/" not in k[len(ctx.train_checkpoints(g)) :]])
    return f"{n} checkpoints"


def _rank_verdicts(ctx: RunContext, g: int) -> str:
    """The rank steps' verdicts of generation g and how many of them could not be read (left out of the fit)."""
    docs = [ctx.store.get_json(k) for t in ctx.spec.train_tasks() if ctx.store.exists(k := ctx.rank(g, t.id))]
    total = sum(len(d.get("verdicts") or []) for d in docs)
    return f"{total} verdicts, {sum(int(d.get('invalid_verdicts') or 0) for d in docs)} invalid" if total else ""


def _verdicts(ctx: RunContext, g: int) -> str:
    return f"{len(ctx.store.list(ctx.eval_verdicts(g + 1)))} verdicts"


# ---------------------------------------------------------------- the table

PIPELINE: tuple[StepDef, ...] = (
    StepDef(
        "search",
        "iteration",
        search.run_search,
        ("search",),
        search.search_steps,
        reads=("model",),
        writes=("search_rollout", "agent_input", "agent_output", "search_state"),
        pod="agent",
        model=True,
        local=("client", "run_episode"),
        cost=search_cost,
    ),
    StepDef(
        "collect",
        "episode",
        collect.run_collect,
        ("collect",),
        collect.collect_steps,
        reads=("search_state",),
        writes=("episode_input", "episode_output", "collect_episode", "collect_summary"),
        pod="agent",
        model=True,
        local=("run_episode",),
        cost=collect_cost,
    ),
    StepDef(
        "guard",
        "task",
        guard.run_guard,
        ("guard",),
        guard.guard_step,
        reads=("collect_summary", "collect_episode"),
        writes=("guard_checks", "agent_input", "agent_output", "guard"),
        pod="agent",
        local=(),
    ),
    StepDef(
        "rank",
        "task",
        rank.run_rank,
        ("rank",),
        rank.rank_step,
        reads=("guard", "collect_episode"),
        writes=("rank", "rank_verdicts"),
        model=True,
        local=("client",),
        cost=rank_cost,
        detail=_rank_verdicts,
    ),
    StepDef(
        "render",
        "generation",
        render_sft.run_render,
        ("render", "sft"),
        render_sft.render_step,
        reads=("rank", "collect_episode", "model"),
        writes=("sft",),
    ),
    StepDef(
        "train",
        "generation",
        train.run_train,
        ("train",),
        train.stored_train_step,
        args=("--resume",),
        reads=("sft", "model"),
        writes=("train",),
        pod="trainer",
        detail=_checkpoints,
        cost=train_cost,
    ),
    StepDef(
        "select",
        "generation",
        select.run_select,
        ("select",),
        select.select_step,
        reads=("train", "model"),
        writes=("select", "select_step", "select_panel"),
    ),
    StepDef(
        "merge",
        "generation",
        merge.run_merge,
        ("merge",),
        merge.merge_step,
        reads=("select", "train", "model"),
        writes=("merge_step", "model"),
        resources="merge",
    ),
    StepDef(
        "evaluate",
        "generation",
        evaluate.evaluate,
        ("evaluate",),
        evaluate.evaluate_step,
        reads=("model",),
        writes=("eval_rollout", "agent_input", "agent_output", "eval", "eval_verdicts"),
        pod="agent",
        gen_offset=1,
        detail=_verdicts,
        local=("serve_generation", "serve_judge", "progress"),
        cost=evaluate_cost,
    ),
    StepDef(
        "report",
        "run",
        report.write_report,
        ("report",),
        report.report_step,
        reads=("eval", "select", "sft", "search_state"),
        writes=("report",),
        local=(),
    ),
)


def agent_step(name: str, ref: str, *, model: bool = True, cost: Callable[[Work], Cost] | None = None) -> StepDef:
    """The row of an agent step declared outside the package (`episodes.agent_step.AgentStep`, named
    by `ref`, "module:NAME"): per training task, its rollouts in agent pods around prepare, ingest and
    finish (`mass rollouts --step REF`); locally its rollouts in-process. `model`: its agents call the
    generation's model."""

    def core(ctx: RunContext, gen: int, task: str, run_episode):
        return declared(ref).run(ctx, gen, task, run_episode)

    def stored(ctx: RunContext, gen: int, task: str) -> list:
        return declared(ref).steps(ctx, gen, task)

    return StepDef(
        name,
        "task",
        core,
        ("rollouts", "--step", ref),
        stored,
        pod="agent",
        model=model,
        local=("run_episode",),
        cost=cost,
    )


def steps(pipeline=None) -> tuple[StepDef, ...]:
    """The table in force: the shipped one, or a pipeline of StepDefs (or "module:NAME" naming one)."""
    if pipeline is None:
        return PIPELINE
    if isinstance(pipeline, str):
        pipeline = pipeline_at(pipeline)
    return tuple(pipeline)


def pipeline_at(ref: str) -> tuple[StepDef, ...]:
    """The pipeline `module:NAME` names (`--pipeline`): a sequence of StepDefs."""
    found = referenced(ref, "--pipeline")
    if not isinstance(found, list | tuple) or not found or not all(isinstance(s, StepDef) for s in found):
        raise ValueError(f"--pipeline {ref}: expected a sequence of StepDefs, found {type(found).__name__}")
    return tuple(found)


def generation_steps(pipeline=None) -> list[StepDef]:
    return [s for s in steps(pipeline) if s.scope != "run"]


def run_steps(pipeline=None) -> list[StepDef]:
    return [s for s in steps(pipeline) if s.scope == "run"]


def by_name(name: str, pipeline=None) -> StepDef:
    for s in steps(pipeline):
        if s.name == name:
            return s
    raise KeyError(f"no step {name!r} in the pipeline: {[s.name for s in steps(pipeline)]}")


def trainer_step(pipeline=None) -> StepDef:
    """The step that trains on a GPU (a PyTorchJob on the cluster)."""
    return next(s for s in steps(pipeline) if s.pod == "trainer")


def done_output(name: str) -> str:
    """The file (and Argo output parameter) where `mass validate --outputs` says a step is stored."""
    return f"done-{name}"


def train_task_ids(ctx: RunContext) -> list[str]:
    return [t.id for t in ctx.spec.train_tasks()]


def argo_outputs(spec, gen: int) -> dict[str, str]:
    """File name -> content of the values a cycle's Argo steps fan out over (ids, counts, URIs)."""
    train = [t.id for t in spec.train_tasks()]
    bucket, _, prefix = spec.store.uri.removeprefix("s3://").partition("/")
    run_prefix = "/".join(p for p in (prefix.strip("/"), spec.name) if p)
    return {
        "train-tasks.json": json.dumps(train),
        "episodes.json": json.dumps(
            [{"task": t, "episode": i} for t in train for i in range(spec.collection.episodes)]
        ),
        "search-iterations": str(spec.search.iterations + 1),  # iteration 0 runs the reference and initial workflow
        "model-uri": model_uri(spec, gen, bucket, run_prefix),
        "dtype": spec.model.dtype,
        "generations": str(spec.generations),
        "store-prefix": run_prefix,
        # the PyTorchJob's world is the spec's: sft.replicas pods x max(1, gpus_per_replica) processes
        "trainer-workers": str(spec.sft.replicas - 1),
        "trainer-nproc": str(max(1, spec.sft.gpus_per_replica)),
        "trainer-gpus": str(spec.sft.gpus_per_replica),
    }
