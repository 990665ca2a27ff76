"""The compiled plan: every node of a run (step x generation x task), with the command line its
container runs, the phases around its agent pods, the store keys it reads and writes, its pod size
and the credentials it gets.

`compile_plan` expands `table.PIPELINE` for one spec; the local runner executes its nodes, `mass
status` and `mass plan` walk them. A node's command lines phase by phase (`phases`: prepare,
ingest, finish, ... by its shape) are derived here alone: the Argo compiler writes its templates
from them with Argo's placeholders, and the local runner's argv handler (`pipeline.handlers`) runs
them with the node's values: prepare -> one `mass episode` per listed rollout, given only its
artifacts -> ingest -> finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from mass_jobs.episodes.rollouts import Phase
from mass_jobs.pipeline import table as P

# What each kind of container may touch: a step pod (and a trainer) reads and writes the run's store;
# an agent pod gets its input artifacts and nothing else (no store credential, no token).
CREDENTIALS = {"step": "store", "trainer": "store", "agent": "none"}


# ---------------------------------------------------------------- the phases' command lines
# After `mass`. Argo fills them with its placeholders, the argv handler with a node's values.


def model_flags(url: str, name: str) -> list[str]:
    """The generation's served model, as a step that calls it is told."""
    return ["--endpoint", url, "--served-model", name]


def round_flags(gen, url: str, name: str) -> list[str]:
    """evaluate's round of L_gen: which generation is served, and where."""
    return ["--served-gen", str(gen), *model_flags(url, name)]


def with_iteration(argv, k) -> list[str]:
    return [*argv, "--iteration", str(k)]


def with_episode(argv, e) -> list[str]:
    return [*argv, "--episode", str(e)]


def plan_rounds(argv, outputs: str) -> list[str]:
    """evaluate: its rounds, one generation's model served in each (OUTPUTS/rounds)."""
    return [*argv, "--phase", Phase.PLAN.value, "--outputs", outputs]


def prepare(argv, model, outputs: str) -> list[str]:
    """The agent pods' inputs, written to the store and listed (OUTPUTS/rollouts, or OUTPUTS/agent
    and OUTPUTS/rollout for one collect episode)."""
    return [*argv, "--phase", Phase.PREPARE.value, *model, "--outputs", outputs]


def ingest(argv, agent_status: str, outputs: str, rollout: str | None = None) -> list[str]:
    """One agent pod's outputs checked and stored, told how the pod ended."""
    return [
        *argv,
        "--phase",
        Phase.INGEST.value,
        *(["--rollout", rollout] if rollout is not None else []),
        "--agent-status",
        agent_status,
        "--outputs",
        outputs,
    ]


def finish(argv, model=()) -> list[str]:
    """The step's own work over what its agent pods left."""
    return [*argv, "--phase", Phase.FINISH.value, *model]


def agent(in_dir: str, out_dir: str) -> list[str]:
    """The agent pod's main container: one episode from its artifacts (the cluster adds its sidecars' sockets)."""
    return ["episode", "--in", in_dir, "--out", out_dir]


# ---------------------------------------------------------------- a node's phases


@dataclass(frozen=True)
class Phases:
    """The command lines of one node, phase by phase, from its shape: derived here alone. The Argo
    compiler fills them with its placeholders, the argv handler with a node's values. A phase the
    shape has not is None."""

    run: list[str] | None = None  # a node without agent pods: its one command (per iteration: search's own)
    plan: list[str] | None = None  # evaluate: the rounds, one served generation each
    prepare: list[str] | None = None  # the agent pods' inputs, listed
    ingest: list[str] | None = None  # one agent pod's outputs stored
    finish: list[str] | None = None  # the work over what the pods left (per iteration; per round: its self-verdicts)
    last: list[str] | None = None  # after every episode or round: collect's summary, evaluate's panel


def phases(
    shape: P.Shape, argv, *, item="", model=(), outputs: str = "", agent_status: str = "", rollout: str | None = None
) -> Phases:
    """`argv`: the node's own command line; `item`: the iteration or episode it runs (a value or a
    placeholder); `model`: the flags of the model it calls (evaluate: its round's); `outputs`,
    `agent_status`, `rollout`: what a phase is told where it runs."""
    argv, model = list(argv), list(model)
    match shape:
        case P.Trainer():
            return Phases(run=argv)
        case P.Recursion(agent=False):
            return Phases(run=[*with_iteration(argv, item), *model])
        case P.Recursion():  # the iteration's pods are ingested by their rollout key alone
            it = with_iteration(argv, item)
            return Phases(
                prepare=prepare(it, model, outputs),
                ingest=ingest(argv, agent_status, outputs, rollout),
                finish=finish(it, model),
            )
        case P.EpisodeFanout():  # one episode per prepare: its ingest needs no rollout key
            ep = with_episode(argv, item)
            return Phases(
                prepare=prepare(ep, model, outputs), ingest=ingest(ep, agent_status, outputs), last=finish(argv)
            )
        case P.TaskRollouts():
            return Phases(
                prepare=prepare(argv, model, outputs),
                ingest=ingest(argv, agent_status, outputs, rollout),
                finish=finish(argv, model),
            )
        case P.GenerationRollouts():
            return Phases(
                plan=plan_rounds(argv, outputs),
                prepare=prepare(argv, model, outputs),
                ingest=ingest(argv, agent_status, outputs, rollout),
                finish=finish(argv, model),
                last=finish(argv),
            )
        case _:
            return Phases(run=[*argv, *model])


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Node:
    """One call of a step: `argv` (after `mass`) is what its container runs; an agent step's phases
    are that argv with `prepare`/`ingest`/`finish` (by its `shape`)."""

    gen: int  # the cycle's generation (evaluate in cycle g judges L_g+1: its argv says --gen g+1)
    step: P.StepDef
    task: str | None
    argv: tuple[str, ...]

    @property
    def key(self) -> tuple[int, str, str | None]:
        return self.gen, self.step.name, self.task

    @property
    def shape(self) -> P.Shape:
        return self.step.shape

    @property
    def pod(self) -> str:
        return self.step.pod

    @property
    def resources(self) -> str:
        """The pod size it gets from the cluster settings (`step`, `merge` or `trainer`); its agent
        pods, if any, get `agent`'s."""
        return "trainer" if self.step.pod == "trainer" else self.step.resources

    @property
    def credentials(self) -> str:
        """What its own container holds (`store`); its agent pods hold `CREDENTIALS['agent']`."""
        return CREDENTIALS["trainer" if self.step.pod == "trainer" else "step"]

    @property
    def agent_credentials(self) -> str | None:
        return CREDENTIALS["agent"] if self.step.pod == "agent" else None

    @property
    def reads(self) -> tuple[str, ...]:
        return self.step.reads

    @property
    def writes(self) -> tuple[str, ...]:
        return self.step.writes

    def done(self, ctx) -> bool:
        return self.step.done(ctx, self.gen, self.task)

    def phases(self, **given) -> Phases:
        """Its command lines by phase, with the values given (`phases`)."""
        return phases(self.shape, self.argv, **given)

    def as_dict(self) -> dict:
        return {
            "gen": self.gen,
            "step": self.step.name,
            "task": self.task,
            "shape": type(self.shape).__name__,
            "pod": self.pod,
            "resources": self.resources,
            "credentials": self.credentials,
            "agent_credentials": self.agent_credentials,
            "argv": list(self.argv),
            "reads": list(self.reads),
            "writes": list(self.writes),
        }


@dataclass(frozen=True)
class Group:
    """The nodes of one step of one generation (one per task for a per-task step), in plan order."""

    gen: int
    step: P.StepDef
    nodes: tuple[Node, ...]

    @property
    def key(self) -> tuple[int, str]:
        return self.gen, self.step.name


@dataclass(frozen=True)
class Plan:
    nodes: tuple[Node, ...]

    def groups(self) -> list[Group]:
        out: list[Group] = []
        for n in self.nodes:
            if out and out[-1].key == (n.gen, n.step.name):
                out[-1] = Group(n.gen, n.step, (*out[-1].nodes, n))
            else:
                out.append(Group(n.gen, n.step, (n,)))
        return out

    def generation(self, g: int) -> list[Group]:
        return [x for x in self.groups() if x.gen == g and x.step.scope != "run"]

    def run_groups(self) -> list[Group]:
        return [x for x in self.groups() if x.step.scope == "run"]


def compile_plan(spec_location: str, spec, pipeline=None) -> Plan:
    """Every node of the run in execution order: each generation's steps (per training task where the
    step is), then the run's steps. Test tasks never reach a per-task node."""
    tasks = [t.id for t in spec.train_tasks()]
    n = spec.generations
    nodes = []
    for g in range(n):
        for sd in P.generation_steps(pipeline):
            for t in tasks if sd.per_task else [None]:
                nodes.append(Node(g, sd, t, tuple(sd.argv(spec_location, g, t))))
    for sd in P.run_steps(pipeline):
        nodes.append(Node(n, sd, None, tuple(sd.argv(spec_location, n))))
    return Plan(tuple(nodes))


def table(ctx, pipeline=None) -> list[dict]:
    """One row per (generation, step) of the plan from the store alone: done or pending, and a
    detail (tasks done, or the step's own).

    This is what any executor leaves (local runner, Argo, a person calling the CLI entries); the
    local runner's run-state only adds running / interrupted / failed on top (`runner.step_status`).
    """
    rows = []
    for group in compile_plan("SPEC", ctx.spec, pipeline).groups():
        s, g = group.step, group.gen
        done_nodes = sum(1 for node in group.nodes if node.done(ctx))
        detail = ", ".join(
            d
            for d in (
                f"{done_nodes}/{len(group.nodes)} tasks" if s.per_task else "",
                s.detail(ctx, g) if s.detail else "",
            )
            if d
        )
        rows.append(
            {
                "gen": g,
                "step": s.name,
                "status": "done" if done_nodes == len(group.nodes) else "pending",
                "detail": detail,
            }
        )
    return rows
