"""Self-ranking of teacher episodes: pairwise verdicts -> Bradley–Terry -> train/val manifests.

    mass rank --spec S --gen G --task T

Episodes usable for ranking are those the guard step marked eligible (outcome success) and not
vetoed. A connected pairing schedule (`ranking.pairing`) is judged by the current model with blind
labels and a shown-first position balanced across the schedule; every verdict is stored under
`rank/<task>/verdicts/` as it arrives, so a rerun only asks what is missing. Unreadable verdicts are
retried, then recorded invalid and left out of the fit (never a silent tie). Bradley–Terry scores
(ties as half wins; `ranking.estimator`, by default the paper's 0.5 virtual wins) order the
episodes; ranks 1..train_ranks go to training and rank `validation_rank` to validation. With fewer
usable episodes than `validation_rank` the step stops with an error, unless
`ranking.fallback: use_available` (all but the last-ranked train, the last validates). Output: `gen-<g>/rank/<task>.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from mass_jobs.config.errors import StepFailed
from mass_jobs.config.shared import Closed
from mass_jobs.episodes.rollouts import derived_seed
from mass_jobs.judging.bradley_terry import fit, ranking
from mass_jobs.judging.compare import Verdict, judge, task_bundle
from mass_jobs.judging.evidence import prompt_budget
from mass_jobs.judging.pairing import schedule
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import role_client, role_label, roles_input
from mass_jobs.steps.guard import FLAGGED
from mass_jobs.steps.search_state import SearchState
from mass_jobs.store import Step, Waiting, formed


class RankError(StepFailed):
    """Too few usable episodes: the stored episodes and guards decide it, so a rerun repeats it."""

    repeats = True


class Ranking(Closed):
    """`gen-<g>/rank/<task>.json`."""

    task: str
    gen: int
    skipped: bool = False
    reason: str | None = None
    episodes: list[str] = Field(default_factory=list, description="Usable episodes that were ranked.")
    excluded: dict[str, list[str]] = Field(default_factory=dict, description="Episode -> why it was not ranked.")
    schedule: list[dict] = Field(default_factory=list, description="Comparisons asked: first (A), second (B), repeat.")
    verdicts: list[Verdict] = Field(default_factory=list)
    invalid_verdicts: int = 0
    scores: dict[str, float] = Field(default_factory=dict, description="Bradley–Terry log-strengths.")
    order: list[str] = Field(default_factory=list, description="Best first; equal scores by episode id.")
    train: list[str] = Field(default_factory=list)
    val: str | None = None
    fallback_used: bool = False


STEP_SCHEMA_MODELS: dict[str, type] = {"verdict": Verdict, "ranking": Ranking, "search-state": SearchState}


def step_schema(name: str) -> dict:
    """JSON Schema of a step output (checked in as schemas/<name>.schema.json)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://mass-jobs.dev/schemas/{name}.schema.json",
        **STEP_SCHEMA_MODELS[name].model_json_schema(mode="validation"),
    }


def write_step_schemas(directory: Path) -> list[Path]:
    import json

    out = []
    for name in STEP_SCHEMA_MODELS:
        path = Path(directory) / f"{name}.schema.json"
        path.write_text(json.dumps(step_schema(name), indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out


def _ep_index(ep: str) -> int:
    return int(ep.rsplit("-", 1)[1])


def select(order: list[str], train_ranks: int, validation_rank: int, fallback: str) -> tuple[list[str], str, bool]:
    """(train ids, val id, fallback used) from a ranking; RankError when there are too few."""
    n = len(order)
    if n >= validation_rank:
        return order[:train_ranks], order[validation_rank - 1], False
    if fallback == "use_available" and n >= 2:
        return order[:-1], order[-1], True
    raise RankError(
        f"{n} usable episode(s), but ranking needs {validation_rank} (collection.validation_rank: "
        f"{train_ranks} for training + rank {validation_rank} for validation)"
        + ("" if fallback == "use_available" else "; set ranking.fallback: use_available to train on what there is")
        + (" — use_available needs at least 2" if fallback == "use_available" else "")
    )


def exclusion_summary(excluded: dict[str, list[str]]) -> str:
    """Why episodes were left out, counted by outcome or guard, with what to change where that is a
    setting (a run whose agents never called a tool stops here, and should say so first)."""
    from collections import Counter

    kinds = Counter(
        r[0].split(":", 1)[0].removeprefix("episode outcome ")
        if r and r[0].startswith("episode outcome ")
        else "flagged for review"
        if r and r[0].startswith(FLAGGED)
        else "vetoed by a guard"
        for r in excluded.values()
    )
    text = f"{len(excluded)} excluded (" + ", ".join(f"{n} {k}" for k, n in kinds.most_common()) + ")"
    if kinds.get("no_work"):
        text += (
            ": no_work episodes ended without a workspace tool call (a model that does not call tools "
            "writes prose); check the model's tool-call format, or set collection.keep_no_work: true "
            "to rank them anyway"
        )
    return text


def rank_step(ctx: RunContext, gen: int, task_id: str):
    """The ranking's Step: its inputs are the stored guard report and the ranking settings."""

    guard_key, col, spec = ctx.guard(gen, task_id), ctx.spec.collection, ctx.spec
    if not ctx.store.exists(guard_key):
        return Waiting(f"task {task_id}: no guard report at {guard_key}; run `mass guard` first")
    return Step(
        ctx.store,
        ctx.rank_step(gen, task_id),
        {
            "guard": ctx.store.sha256(guard_key),
            "ranking": ctx.spec.ranking.model_dump(mode="json"),
            "train_ranks": col.train_ranks,
            "validation_rank": col.validation_rank,
            **({"evaluator": roles_input(spec)["evaluator"]} if spec.roles.evaluator else {}),
        },
        name=f"rank/{task_id}",
    )


def _verdicts(ctx: RunContext, gen: int, task, episodes: list[str], plan, client, judged_by: str) -> list[Verdict]:
    """The plan's verdicts, in its order: each stored one read, each missing one asked and stored."""
    spec, store, cfg = ctx.spec, ctx.store, ctx.spec.ranking
    bundles = {e: task_bundle(store, ctx.collect_episode(gen, task.id, e), spec, task) for e in episodes}
    verdicts: list[Verdict] = []
    for n, c in enumerate(plan):
        a, b = episodes[c.first], episodes[c.second]
        vkey = ctx.rank_verdict(gen, task.id, n, a, b, c.repeat)
        if store.exists(vkey):
            v = Verdict.model_validate(store.get_json(vkey))
        else:
            v = judge(
                client,
                task.judged_text,
                (a, bundles[a]),
                (b, bundles[b]),
                retries=cfg.verdict_retries,
                seed=derived_seed(spec.search.seed, task.id, gen, "rank", n),
                budget_tokens=prompt_budget(spec),
            ).model_copy(update={"model": judged_by})
            store.put_json(vkey, v.model_dump(mode="json"))
        verdicts.append(v)
    return verdicts


def run_rank(ctx: RunContext, gen: int, task_id: str, client: Any) -> Ranking:
    """Library core of `mass rank` and the local runner."""

    spec, store = ctx.spec, ctx.store
    task = spec.task(task_id)
    cfg, col = spec.ranking, spec.collection
    client, judged_by = role_client(spec, "evaluator", client), role_label(spec, "evaluator", gen)
    step = formed(rank_step(ctx, gen, task_id), RankError)
    guard = store.get_json(ctx.guard(gen, task_id))
    key = ctx.rank(gen, task_id)
    if step.done:
        return Ranking.model_validate(store.get_json(key))
    if guard.get("skipped"):  # collect skipped the task: nothing to rank, said so
        reason = store.get_json(ctx.collect_summary(gen, task_id)).get("reason")
        return _stored(ctx, step, key, Ranking(task=task_id, gen=gen, skipped=True, reason=reason), {"skipped": True})

    episodes = sorted(
        (e for e, g in guard["episodes"].items() if g["eligible"] and g["passed"] and not g.get("held")), key=_ep_index
    )
    excluded = {e: g["reasons"] for e, g in guard["episodes"].items() if e not in episodes}
    if len(episodes) < col.validation_rank:  # fail before asking for any verdict, unless the fallback applies
        try:
            select(episodes, col.train_ranks, col.validation_rank, cfg.fallback)
        except RankError as e:
            raise RankError(f"task {task_id}: {e}; {exclusion_summary(excluded)}; excluded: {excluded}") from None

    plan = schedule(
        len(episodes),
        cfg.pairing,
        cfg.comparisons_per_episode,
        cfg.verdicts_per_pair,
        cfg.both_orders,
        seed=derived_seed(spec.search.seed, task_id, gen, "pairing"),
    )
    verdicts = _verdicts(ctx, gen, task, episodes, plan, client, judged_by)

    valid = [v for v in verdicts if v.valid]
    scores = fit(
        episodes, [(v.first, v.second, v.score_of_first()) for v in valid], estimator=cfg.estimator, prior=cfg.prior
    )
    order = [str(e) for e in ranking(scores)]
    train, val, fallback_used = select(order, col.train_ranks, col.validation_rank, cfg.fallback)
    result = Ranking(
        task=task_id,
        gen=gen,
        episodes=episodes,
        excluded=excluded,
        schedule=[{"first": episodes[c.first], "second": episodes[c.second], "repeat": c.repeat} for c in plan],
        verdicts=verdicts,
        invalid_verdicts=len(verdicts) - len(valid),
        scores={e: round(s, 9) for e, s in scores.items()},
        order=order,
        train=train,
        val=val,
        fallback_used=fallback_used,
    )
    return _stored(
        ctx, step, key, result, {"train": len(train), "val": val, "invalid_verdicts": result.invalid_verdicts}
    )


def _stored(ctx: RunContext, step, key: str, result: Ranking, extra: dict) -> Ranking:
    ctx.store.put_json(key, result.model_dump(mode="json"))
    step.finish([key], extra=extra)
    return result
