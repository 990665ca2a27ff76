"""`mass plan`'s cost model of each step: seconds one unit of its work takes, its units and the
judge calls after them, from a generation's counts and the timings in force."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """What a step's cost model sees of one generation: `planning.counts` and the timings in force."""

    counts: dict
    timings: dict
    n_train: int

    @property
    def per_task_calls(self) -> int:
        return self.counts["ranking_calls"] // max(self.n_train, 1)


@dataclass(frozen=True)
class Cost:
    unit_s: float  # one unit (an episode, a task, the whole step)
    units: int
    calls: int = 0  # judge calls after the units, fanned out like them


def search_cost(w: Work) -> Cost:
    # per task: the reference, the initial elite and one episode per proposal; a proposal and two
    # verdicts per iteration, and the first judging
    k = w.counts["optimizer_proposals"] // max(w.n_train, 1)
    t = w.timings
    return Cost((k + 2) * t["episode_s"] + (2 * k + 1) * t["call_s"], w.n_train)


def collect_cost(w: Work) -> Cost:
    return Cost(w.timings["episode_s"], w.counts["teacher_episodes"])


def rank_cost(w: Work) -> Cost:
    return Cost(w.per_task_calls * w.timings["call_s"], w.n_train)


def train_cost(w: Work) -> Cost:
    return Cost(w.counts["steps"] * w.timings["step_s"], 1)


def evaluate_cost(w: Work) -> Cost:
    return Cost(
        w.timings["episode_s"],
        w.counts["rollout_episodes"],
        calls=w.counts["judge_calls"] + w.counts["self_judge_calls"],
    )
