"""The run report, rebuilt from stored artifacts alone: `<run>/report/{report.json,report.md,*.png}`.

    mass report --spec S

Reads only the store (verdicts, eval rollouts and their audits, search states, guard verdicts,
SFT stats, training logs, selection) and recomputes every number with `mass_jobs.judging.metrics`, so the
report of a resumed run equals the report of an uninterrupted one whenever the stored artifacts do.
report.json is validated against schemas/report.schema.json (generated from `report_document.Report`;
report.md and the plots are `report_render`'s).
No clocks, no hosts, no temp paths in the report: rebuilding it twice gives identical bytes.

Confidence intervals: per task, the Wilson score interval over that task's decisive verdicts;
overall, a percentile bootstrap that resamples TASKS (`evaluation.bootstrap` resamples, seed 0).

Numbers say what they are: the report opens with "how to read this" (what each number is, its n,
and which are noise at that n); a pair whose panel has no majority is counted as such, never as a
disagreement; a comparison whose judge picked one blind label every time carries a position-bias
note; every plot shows its n.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mass_jobs.episodes.harness import CAPS, OUTCOMES, episode_cap
from mass_jobs.judging import metrics
from mass_jobs.judging.information import workflow_information
from mass_jobs.judging.judges import load_verdicts
from mass_jobs.run.context import RunContext
from mass_jobs.steps.report_document import (
    Agreement,
    Audit,
    InvalidVerdict,
    JudgeInfo,
    NetworkCounts,
    Outcomes,
    Report,
    SearchCurve,
    Tokens,
    Training,
    VerdictCounts,
    WinShare,
    sft_data,
    validate_report,
)
from mass_jobs.steps.report_figures import render_plots
from mass_jobs.steps.report_inputs import (
    elite_beats_by_iteration,
    evaluated_generations,
    guard_counts,
    guard_reviews,
    guard_vetoes,
    json_or_none,
    jsonl_records,
    loss_curves,
    role_players,
    rollout_grades,
    run_composition,
    selected_step,
    stored_statuses,
    stored_supervised,
    task_scores,
)
from mass_jobs.steps.report_reading import how_to_read, run_warnings, trained_no_work
from mass_jobs.steps.report_render import render_markdown
from mass_jobs.store import Step
from mass_jobs.store.manifest import MANIFEST_NAME

# ---------------------------------------------------------------- reading the store


# ---------------------------------------------------------------- building


@dataclass
class _Rows:
    """The report's per-generation rows, gathered generation by generation."""

    tokens: list = field(default_factory=list)
    outcomes: list = field(default_factory=list)
    sft: list = field(default_factory=list)
    training: list = field(default_factory=list)
    search: list = field(default_factory=list)
    vetoes: list = field(default_factory=list)
    reviews: list = field(default_factory=list)
    ranked: list = field(default_factory=list)  # every rank step's verdicts (the self-judged pairs that chose the data)


def _win_share(panel: list[dict], split_of: dict[str, str], ev) -> list:
    """The panel's win share per comparison and split (train, test, all)."""
    out = []
    for cand, base in sorted({(v["candidate"], v["baseline"]) for v in panel}):
        vs = [v for v in panel if v["candidate"] == cand and v["baseline"] == base]
        for split in ("train", "test", "all"):
            ids = [t for t in split_of if split == "all" or split_of[t] == split]
            if not ids:
                continue
            summary = metrics.comparison_summary(metrics.compare(vs, ids), ev.confidence, ev.bootstrap, seed=0)
            positions = metrics.position_counts([v for v in vs if v["task"] in ids])
            out.append(
                WinShare(
                    candidate=cand,
                    baseline=base,
                    split=split,
                    **summary,
                    positions=positions,
                    note=metrics.position_bias_note(positions),
                )
            )
    return out


def _audits(ctx: RunContext, tasks, split_of: dict[str, str]) -> list:
    """The behaviour audit and task scores of each generation's bare-prompt rollouts, per split."""
    store, out = ctx.store, []
    rollout_audits = [
        (ctx.eval_rollout_of(k), k) for k in store.list(ctx.eval_root() + "/") if k.endswith("/audit.json")
    ]
    rollout_audits = [(where, k) for where, k in rollout_audits if where is not None]
    for h in sorted({where[0] for where, _ in rollout_audits}):
        audits = [(where[1], store.get_json(k)) for where, k in rollout_audits if where[0] == h]
        grades = rollout_grades(
            store, [(where[1], k) for where, k in rollout_audits if where[0] == h], {t.id: t for t in tasks}
        )
        for split in ("train", "test", "all"):
            chosen = [a for task, a in audits if split == "all" or split_of.get(task) == split]
            scored = [g for task, g in grades if split == "all" or split_of.get(task) == split]
            if chosen or split == "all":
                out.append(Audit(generation=h, split=split, **metrics.audit_rates(chosen), **task_scores(scored)))
    return out


def _stage_outcomes(g: int, stage: str, sts: list[dict]) -> Outcomes:
    """How one stage's episodes of generation g ended: outcomes, caps, tool calls, their network."""
    counted = Counter(str(st.get("outcome")) for st in sts)
    capped = Counter(episode_cap(st) for st in sts)
    calls = sum(int((st.get("counts") or {}).get("tool_calls") or 0) for st in sts)
    online = [st["network"] for st in sts if isinstance(st.get("network"), dict)]
    network = (
        None
        if not online
        else NetworkCounts(
            episodes=len(online),
            **{k: sum(int(n.get(k, 0)) for n in online) for k in ("requests", "allowed", "denied", "bytes_down")},
            hosts=sorted({h for n in online for h in n.get("hosts", [])}),
        )
    )
    return Outcomes(
        generation=g,
        stage=stage,
        episodes=len(sts),
        network=network,
        by_outcome={o: counted.get(o, 0) for o in (*OUTCOMES, *sorted(set(counted) - set(OUTCOMES)))},
        by_cap={c: capped.get(c, 0) for c in CAPS},
        tool_calls=calls,
        tool_calls_per_episode=round(calls / len(sts), 3),
        unsandboxed=sum((st.get("sandbox") or {}).get("boundary") == "none" for st in sts),
        ended_by_pod=dict(sorted(Counter(st["_task"] for st in sts if st.get("ended_by") == "pod").items())),
    )


def _add_generation(rows: _Rows, ctx: RunContext, g: int, train: list[str]) -> None:
    """Generation g's rows: episode outcomes and tokens, SFT data, training, search, guards, ranking."""
    store = ctx.store
    st_eval, st_search = stored_statuses(store, ctx.eval(g)), stored_statuses(store, ctx.search_root(g))
    st_collect = stored_statuses(store, ctx.collect_root(g))
    gen_eval, gen_search, gen_collect = map(metrics.generated_tokens, (st_eval, st_search, st_collect))
    rows.outcomes += [
        _stage_outcomes(g, stage, sts)
        for stage, sts in (("search", st_search), ("collect", st_collect), ("evaluate", st_eval))
        if sts
    ]
    stats = json_or_none(store, ctx.sft_file(g, "stats"))
    if sft_data(stats, g):
        rows.sft.append(sft_data(stats, g))
    log = jsonl_records(store, ctx.train_log(g))
    select_doc = json_or_none(store, ctx.select(g))
    chosen = selected_step(select_doc)
    processed = metrics.processed_tokens([x for x in log if x.get("kind", "train") == "train"], chosen)
    if gen_eval or gen_search or gen_collect or stats or log:
        rows.tokens.append(
            Tokens(
                generation=g,
                generated_search=gen_search,
                generated_collect=gen_collect,
                generated_eval=gen_eval,
                generated_total=gen_search + gen_collect + gen_eval,
                generated_episodes=len(st_eval) + len(st_search) + len(st_collect),
                stored_supervised=stored_supervised(stats),
                processed_to_selected=processed["to_selected"],
                processed_to_end=processed["to_end"] if log else None,
            )
        )
    if log or chosen is not None:
        train_loss, val_loss = loss_curves(log)
        rows.training.append(
            Training(
                generation=g,
                selected_step=chosen,
                train_loss=train_loss,
                val_loss=val_loss,
                selected_by=(select_doc or {}).get("by", "val_loss") if chosen is not None else None,
            )
        )
    _add_search_and_guards(rows, ctx, g, train)


def _add_search_and_guards(rows: _Rows, ctx: RunContext, g: int, train: list[str]) -> None:
    """Generation g's search curve, guard vetoes and reviews, and rank verdicts."""
    store, spec = ctx.store, ctx.spec
    states = {t: json_or_none(store, ctx.search_state(g, t)) for t in train}
    states = {t: s for t, s in states.items() if s}
    if states:
        beats = {t: elite_beats_by_iteration(s) for t, s in states.items()}
        rows.search.append(
            SearchCurve(
                generation=g,
                iterations=spec.search.iterations,
                tasks=len(states),
                coverage=metrics.search_coverage(beats, spec.search.iterations),
                beats_reference={t: bool(s.get("beats_reference")) for t, s in states.items()},
            )
        )
    for t in train:
        doc = json_or_none(store, ctx.guard(g, t))
        if doc:
            rows.vetoes += guard_vetoes(doc, g, t)
            rows.reviews += guard_reviews(doc, g, t)
        rows.ranked += (json_or_none(store, ctx.rank(g, t)) or {}).get("verdicts") or []


def _count(vs: list[dict]) -> VerdictCounts:
    valid = sum(bool(v.get("valid")) for v in vs)
    return VerdictCounts(total=len(vs), valid=valid, invalid=len(vs) - valid)


def _invalid(v: dict) -> InvalidVerdict:
    fields = ("candidate", "baseline", "task", "replicate", "judge", "seed")
    return InvalidVerdict(**{k: v[k] for k in fields}, errors=v.get("errors", []))


def build_report(ctx: RunContext, embedder=None) -> dict:
    """report.json content (without `files`), computed from the store alone (`embedder`: of the
    workflow information proxies; the built-in hash embedder when None)."""

    spec, store = ctx.spec, ctx.store
    tasks = spec.resolved_tasks()
    split_of = {t.id: t.split for t in tasks}
    by_split = {
        "train": [t.id for t in tasks if t.split == "train"],
        "test": [t.id for t in tasks if t.split == "test"],
    }
    ev = spec.evaluation
    evaluated = evaluated_generations(ctx)
    verdicts = load_verdicts(store, ctx.verdicts())
    panel = [v for v in verdicts if v.get("kind") == "panel"]
    own = [v for v in verdicts if v.get("kind") == "self"]

    win_share = _win_share(panel, split_of, ev)
    agreement = [
        Agreement(evaluator=h, **metrics.agreement([v for v in own if v["judge"] == f"gen-{h}"], panel))
        for h in sorted({int(v["judge"].removeprefix("gen-")) for v in own})
    ]
    audit = _audits(ctx, tasks, split_of)
    rows = _Rows()
    for g in range(spec.generations + 1):
        _add_generation(rows, ctx, g, by_split["train"])
    doc = Report(
        run=ctx.run,
        how_to_read=[],
        generations=spec.generations,
        evaluated=evaluated,
        tasks=by_split,
        confidence=ev.confidence,
        intervals={
            "per_task": "wilson score interval",
            "overall": f"percentile bootstrap over tasks, {ev.bootstrap} resamples, seed 0",
        },
        judges=[JudgeInfo(name=j.name, model=j.model, seeds=list(j.seeds)) for j in spec.judges],
        verdicts={"panel": _count(panel), "self": _count(own), "rank": _count(rows.ranked)},
        win_share=win_share,
        agreement=agreement,
        audit=audit,
        tokens=rows.tokens,
        outcomes=rows.outcomes,
        sft=rows.sft,
        search=rows.search,
        guard_vetoes=rows.vetoes,
        guard_counts=guard_counts(rows.vetoes, rows.reviews),
        review=rows.reviews,
        training=rows.training,
        invalid_verdicts=[_invalid(v) for v in panel if not v.get("valid")],
        files=[],
        information=workflow_information(ctx, embedder),
        roles=role_players(ctx),
        composition=run_composition(spec),
    ).model_dump(mode="json")
    doc["how_to_read"] = how_to_read(doc)
    doc["warnings"] = run_warnings(doc) + trained_no_work(doc, spec.collection.keep_no_work)
    return doc


def report_step(ctx: RunContext):
    """The report's Step: its inputs are the spec (without its store) and every other step's stored
    manifest (input hash and pinned outputs), so a finished step or a changed setting redoes it,
    and checking it reads manifests only (no bootstrap, no embedding)."""

    own = ctx.report() + "/"
    stored = {}
    for key in ctx.store.list(ctx.run + "/"):
        if key.endswith("/" + MANIFEST_NAME) and not key.startswith(own):
            doc = ctx.store.get_json(key)
            stored[key] = {"input_hash": doc.get("input_hash"), "outputs": doc.get("outputs")}
    return Step(
        ctx.store,
        ctx.report(),
        {"spec": ctx.spec.model_dump(mode="json", exclude={"store"}), "stored": stored},
        name="report",
    )


def write_report(ctx: RunContext) -> dict:
    """Build, validate and store `<run>/report/` (manifest last); returns report.json's content,
    or the stored one when nothing the report reads changed."""
    step = report_step(ctx)
    if step.done:
        return ctx.store.get_json(ctx.report_file("report.json"))
    doc = build_report(ctx)
    with tempfile.TemporaryDirectory(prefix="mass-report-") as tmp:
        out = Path(tmp)
        files = sorted(render_plots(doc, out) + ["report.json", "report.md"])
        doc["files"] = files
        validate_report(doc)
        (out / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (out / "report.md").write_text(render_markdown(doc))
        step.start()
        for name in files:
            ctx.store.put_file(ctx.report_file(name), out / name)
        step.finish([ctx.report_file(name) for name in files])
    return doc
