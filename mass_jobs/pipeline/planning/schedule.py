"""The pipeline table simulated as the Argo DAG runs it, against one episode after another.

Each step of the compiled plan (`pipeline.nodes`) is a stage after the previous one, generation
after generation (as the compiled workflow orders them): a per-task step runs its tasks side by side, the episode fan-out
runs every episode of the generation at most `parallelism` at once, and the rest runs once.
Upstream's loop runs every episode, verdict and step one after another: its time is the sum.
Durations: a stored run's timings when given (episode wall time from its status files, training
step time from its log), else the defaults below, which the plan prints.

    mass plan SPEC --timings PREVIOUS_SPEC --gantt schedule.png
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from mass_jobs.pipeline.costs import Work
from mass_jobs.pipeline.nodes import compile_plan
from mass_jobs.pipeline.shapes import EpisodeFanout, GenerationRollouts

DEFAULTS = {"episode_s": 600.0, "call_s": 20.0, "step_s": 30.0, "fixed_s": 60.0}


@dataclass
class Bar:
    gen: int
    step: str
    lane: str
    start: float
    end: float


def stored_timings(ctx) -> dict:
    """Mean episode wall time and training step time of a stored run (missing ones: the defaults)."""
    walls, step_s = [], []
    for key in ctx.store.list(ctx.under_run("")):
        if key.endswith("/status.json") and ("/search/" in key or "/collect/" in key or "/eval/" in key):
            wall = json.loads(ctx.store.get_bytes(key)).get("timings", {}).get("wall_s")
            if wall:
                walls.append(float(wall))
        elif key.endswith("/train/timing.jsonl"):
            step_s += [
                r["step_s"] for r in map(json.loads, ctx.store.get_bytes(key).decode().splitlines()) if "step_s" in r
            ]
    out = dict(DEFAULTS)
    if walls:
        out["episode_s"] = sum(walls) / len(walls)
    if step_s:
        out["step_s"] = sum(step_s) / len(step_s)
    out["source"] = f"stored run {ctx.run!r} ({len(walls)} episodes, {len(step_s)} steps)" if walls else "defaults"
    return out


def simulate(spec, counts: list[dict], timings: dict, parallelism: int) -> tuple[list[Bar], float, float]:
    """(bars of the DAG schedule, its makespan, the one-after-another time) in seconds.

    Each step's cost model (`StepDef.work`) gives its units; how they overlap follows from how the
    workflow runs it: an episode fan-out fills `parallelism` slots, a generation's agent rollouts
    (and the judge calls after them) run `parallelism` at once, a per-task step runs its tasks
    side by side, any other step is one unit."""
    n_train = len(spec.train_tasks())
    plan = compile_plan("SPEC", spec)
    bars, now, serial = [], 0.0, 0.0
    for c in counts:
        g = c["gen"]
        for sd in (group.step for group in plan.generation(g)):
            cost = sd.work(Work(c, timings, n_train))
            unit, units = cost.unit_s, cost.units
            if isinstance(sd.shape, GenerationRollouts):
                dur = math.ceil(units / parallelism) * unit + math.ceil(cost.calls / parallelism) * timings["call_s"]
                serial += units * unit + cost.calls * timings["call_s"]
                bars.append(Bar(g, sd.name, sd.name, now, now + dur))
            elif isinstance(sd.shape, EpisodeFanout):
                slots = [now] * min(parallelism, max(units, 1))
                for _ in range(units):
                    j = min(range(len(slots)), key=slots.__getitem__)
                    bars.append(Bar(g, sd.name, f"{sd.name} slot {j}", slots[j], slots[j] + unit))
                    slots[j] += unit
                dur = max(slots) - now if units else 0.0
                serial += units * unit
            elif sd.per_task:
                for i in range(units):
                    bars.append(Bar(g, sd.name, f"{sd.name} task {i}", now, now + unit))
                dur, serial = unit, serial + units * unit
            else:
                bars.append(Bar(g, sd.name, sd.name, now, now + unit * units))
                dur, serial = unit * units, serial + unit * units
            now += dur
    for sd in (group.step for group in plan.run_groups()):
        unit = sd.work(Work({}, timings, n_train)).unit_s
        bars.append(Bar(len(counts), sd.name, sd.name, now, now + unit))
        now += unit
        serial += unit
    return bars, now, serial


def gantt(bars: list[Bar], makespan: float, serial: float, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = list(dict.fromkeys(b.lane for b in bars))
    names = list(dict.fromkeys(b.step for b in bars))
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(11, 0.28 * len(lanes) + 1.8))
    for b in bars:
        ax.barh(
            lanes.index(b.lane),
            (b.end - b.start) / 3600,
            left=b.start / 3600,
            color=colors[b.step],
            edgecolor="black",
            linewidth=0.2,
        )
    ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("hours")
    ax.set_title(f"Argo DAG: {makespan / 3600:.1f} h; every episode one after another: {serial / 3600:.1f} h")
    for n in names:
        ax.barh(0, 0, color=colors[n], label=n)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=len(names), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
