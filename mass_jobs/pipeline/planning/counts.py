"""Per-generation counts a spec asks for, and the same counts read from a stored run.

Cycle g turns L_g into L_{g+1}: search and collection on the training tasks, ranking, SFT, then
`evaluate --gen g+1`. A count the spec fixes is exact; one the data decides is the upper bound
(every proposal parses, every task is collected, every episode passes its guards):

    mass plan SPEC            (the counts table)
"""

from __future__ import annotations

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.judging.pairing import schedule
from mass_jobs.steps.evaluate import baselines, new_rollout_generations, self_evaluators

# counts a tiny run's store must equal exactly / may only stay below
EXACT = (
    "search_iterations",
    "optimizer_proposals",
    "teacher_episodes",
    "ranking_calls",
    "steps",
    "rollout_episodes",
    "judge_calls",
    "self_judge_calls",
)
BOUNDS = ("search_rollouts", "sft_windows_max", "processed_tokens_max")


def world_size(spec: RunSpec) -> int:
    """Ranks of the trainer: replicas x GPUs each (a CPU replica is one process)."""
    return spec.sft.replicas * max(spec.sft.gpus_per_replica, 1)


def replies_per_episode_max(spec: RunSpec) -> int | None:
    """Model replies one episode can hold: every agent thread (the orchestrator plus one per
    delegation, and delegations are tool calls) runs at most `turns_per_agent` turns. None (no
    bound) when either cap is off, as upstream runs episodes."""
    lim = spec.execution.limits
    if lim.tool_calls is None or lim.turns_per_agent is None:
        return None
    return (lim.tool_calls + 1) * lim.turns_per_agent


def generation_counts(spec: RunSpec, g: int) -> dict:
    """The counts of cycle g (L_g -> L_{g+1}); see the module docstring for exact vs bound."""

    tasks = spec.resolved_tasks()
    n_train = len(spec.train_tasks())
    n_all = len(tasks)
    k, e = spec.search.iterations, spec.collection.episodes
    rk = spec.ranking
    per_task_calls = len(schedule(e, rk.pairing, rk.comparisons_per_episode, rk.verdicts_per_pair, rk.both_orders))
    kept = min(spec.collection.train_ranks, e - 1) + 1  # training ranks + the validation rank
    reps = spec.evaluation.rollouts_per_task
    gen = g + 1
    new_rollout_gens = new_rollout_generations(gen)
    pairs = len(baselines(gen)) * n_all * reps
    per_window = world_size(spec) * spec.sft.grad_accum
    return {
        "gen": g,
        # search: iteration 0 rolls out the bare reference and the initial workflow, k >= 1 one proposal each
        "search_iterations": n_train * (k + 1),
        "optimizer_proposals": n_train * k,
        "search_rollouts": n_train * (k + 2),
        "search_verdicts_max": n_train * (1 + 2 * k),  # vs the elite, and vs the reference when it changed
        "teacher_episodes": n_train * e,
        "ranking_calls": n_train * per_task_calls,
        "sft_windows_max": None if (r := replies_per_episode_max(spec)) is None else n_train * kept * r,
        "steps": spec.sft.steps,
        "windows_per_step": per_window,
        "processed_tokens_max": spec.sft.steps * per_window * (spec.sft.window - 1),
        "rollout_episodes": len(new_rollout_gens) * n_all * reps,
        "judge_calls": pairs * sum(len(j.seeds) for j in spec.judges),
        "self_judge_calls": pairs * len(self_evaluators(gen)),
    }


def plan_counts(spec: RunSpec) -> list[dict]:
    return [generation_counts(spec, g) for g in range(spec.generations)]


def stored_counts(ctx, g: int) -> dict:
    """The same counts from what cycle g left in the store (searched, collected, ranked, trained)."""
    import json

    store, spec = ctx.store, ctx.spec
    train = [t.id for t in spec.train_tasks()]
    out = {k: 0 for k in (*EXACT, "search_rollouts", "sft_windows_max", "processed_tokens_max")}
    out["gen"], out["all_ranked"] = g, True
    for t in train:
        search = store.list(ctx.search(g, t) + "/")
        iters = {k.split("/iter-")[1].split("/")[0] for k in search if "/iter-" in k and k.endswith("/_manifest.json")}
        out["search_iterations"] += len(iters)
        out["optimizer_proposals"] += sum(1 for k in search if k.endswith("/proposal.json"))
        # an agent pod's input/output copies of a rollout are not rollouts of their own
        out["search_rollouts"] += sum(1 for k in search if k.endswith("/status.json") and not ctx.is_pod_copy(k))
        collect = store.list(ctx.collect(g, t) + "/")
        out["teacher_episodes"] += sum(1 for k in collect if "/ep-" in k and k.endswith("/_manifest.json"))
        ranking = json.loads(store.get_bytes(ctx.rank(g, t)))
        out["ranking_calls"] += len(ranking["verdicts"])
        out["all_ranked"] &= len(ranking["episodes"]) == spec.collection.episodes
    out["sft_windows_max"] = sum(
        len([x for x in store.get_bytes(ctx.sft_file(g, s)).decode().splitlines() if x.strip()])
        for s in ("train", "val")
    )
    log = [json.loads(x) for x in store.get_bytes(ctx.train_log(g)).decode().splitlines() if x.strip()]
    trained = [r for r in log if r["kind"] == "train"]
    out["steps"] = max((r["step"] for r in trained), default=0)
    out["processed_tokens_max"] = trained[-1]["processed_tokens"] if trained else 0
    gen = g + 1
    fresh = [gen] + ([0] if g == 0 else [])
    out["rollout_episodes"] = sum(
        1 for h in fresh for k in store.list(ctx.eval(h) + "/") if "/rep-" in k and k.endswith("/_manifest.json")
    )
    verdicts = store.list(ctx.eval_verdicts(gen))
    out["judge_calls"] = sum(1 for k in verdicts if k.rsplit("/", 1)[-1].startswith("panel-"))
    out["self_judge_calls"] = sum(1 for k in verdicts if k.rsplit("/", 1)[-1].startswith("self-"))
    return out


def compare(planned: dict, stored: dict) -> list[str]:
    """What a stored cycle did that its plan did not say (empty: the plan held). The ranking calls
    are exact when every teacher episode passed its guards, else bounded by the plan."""
    exact = [k for k in EXACT if k != "ranking_calls" or stored.get("all_ranked", True)]
    bad = [f"{k}: planned {planned[k]}, stored {stored[k]}" for k in exact if planned[k] != stored[k]]
    bad += [
        f"{k}: bound {planned[k]}, stored {stored[k]}"
        for k in (*BOUNDS, "ranking_calls")
        if k not in exact and planned[k] is not None and stored[k] > planned[k]
    ]
    return bad
