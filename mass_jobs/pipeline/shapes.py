"""The plan's shapes: what one step becomes in an executor, derived once from its scope and pod
(`StepDef.shape`). The Argo compiler, `mass plan`, the compiled plan's phases and the local runner
match on these types, never on a step's name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Container:
    """One container per generation (`run`: once, after the last generation)."""

    once_per_run: bool = False


@dataclass(frozen=True)
class TaskFanout:
    """A container per training task, side by side."""


@dataclass(frozen=True)
class Recursion:
    """Per training task, one iteration per call, K+1 after K (`agent`: each iteration's rollouts
    run in agent pods between its prepare and its finish)."""

    agent: bool


@dataclass(frozen=True)
class EpisodeFanout:
    """Per task and episode prepare -> sandboxed agent pod -> ingest, a bounded number at once, then
    the task's summary."""


@dataclass(frozen=True)
class TaskRollouts:
    """Per training task prepare -> its agent pods -> finish with their results."""


@dataclass(frozen=True)
class GenerationRollouts:
    """Once per generation: serve the generations it names, prepare -> agent pods -> finish, release."""


@dataclass(frozen=True)
class Trainer:
    """A multi-process GPU trainer: torchrun locally, a PyTorchJob on the cluster."""


Shape = Container | TaskFanout | Recursion | EpisodeFanout | TaskRollouts | GenerationRollouts | Trainer
# (scope, pod) -> shape; a pair not listed is refused when the step is declared
SHAPES: dict[tuple[str, str], Shape] = {
    ("run", "step"): Container(once_per_run=True),
    ("generation", "step"): Container(),
    ("task", "step"): TaskFanout(),
    ("iteration", "step"): Recursion(agent=False),
    ("iteration", "agent"): Recursion(agent=True),
    ("episode", "agent"): EpisodeFanout(),
    ("task", "agent"): TaskRollouts(),
    ("generation", "agent"): GenerationRollouts(),
    ("generation", "trainer"): Trainer(),
}
