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

from mass_jobs.config.composition import composition_of
from mass_jobs.episodes.harness import CAPS, OUTCOMES, episode_cap
from mass_jobs.judging import metrics
from mass_jobs.judging.grade import grade_workspace
from mass_jobs.judging.information import workflow_information
from mass_jobs.judging.judges import load_verdicts
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import ROLES, recorded_players, role_label
from mass_jobs.steps.guard import guard_class
from mass_jobs.steps.report_document import (
    Agreement,
    Audit,
    GuardCount,
    InvalidVerdict,
    JudgeInfo,
    NetworkCounts,
    Outcomes,
    Report,
    Review,
    RolePlayer,
    SearchCurve,
    Tokens,
    Training,
    VerdictCounts,
    Veto,
    WinShare,
    sft_data,
    validate_report,
)
from mass_jobs.steps.report_reading import how_to_read, run_warnings, trained_no_work
from mass_jobs.steps.report_render import render_markdown, render_plots
from mass_jobs.store import Step, read_manifest
from mass_jobs.store.manifest import MANIFEST_NAME

# ---------------------------------------------------------------- reading the store


def _json_or_none(store, key: str):
    return store.get_json(key) if store.exists(key) else None


def _jsonl(store, key: str) -> list[dict]:
    if not store.exists(key):
        return []
    out = []
    for line in store.get_bytes(key).decode("utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer
    return out


def _statuses(store, prefix: str) -> list[dict]:
    """Episode statuses under prefix (`PREFIX/<task>/...`), each with its task as `_task`; an agent
    pod's input/ and output/ copies (collect episodes, search and evaluate rollouts) are not episodes
    (ingest promotes output/ to the rollout's own files, which are counted)."""
    return [{**store.get_json(k), "_task": k[len(prefix) + 1:].split("/", 1)[0]} for k in store.list(prefix + "/")
            if k.endswith("/status.json") and not RunContext.is_pod_copy(k)]


def evaluated_generations(ctx: RunContext) -> list[int]:

    return [g for g in range(1, ctx.spec.generations + 1) if read_manifest(ctx.store, ctx.eval(g)) is not None]


def elite_beats_by_iteration(state: dict) -> list[bool]:
    """Replays a search state: after iteration k, did the elite held then beat the bare reference?"""
    beats, out = False, []
    for i, rec in enumerate(state.get("iterations", [])):
        ref = rec.get("reference_verdict") or {}
        if i == 0 or rec.get("preferred"):
            beats = ref.get("valid", False) and ref.get("winner") == f"iter-{rec['k']}"
        out.append(bool(beats))
    return out


def selected_step(doc: dict | None) -> int | None:
    if not doc:
        return None
    for key in ("step", "selected_step"):
        if isinstance(doc.get(key), int):
            return doc[key]
    return None


def guard_vetoes(doc: dict, g: int, task: str) -> list[Veto]:
    """Vetoed episodes of one guard report (`vetoed` ids; reasons from `episodes[id]`)."""

    episodes = doc.get("episodes") or {}
    out = []
    for ep in doc.get("vetoed", []):
        reasons = [str(r) for r in episodes.get(ep, {}).get("reasons", [])]
        classes = sorted({guard_class(r) for r in reasons if not r.startswith("episode outcome ")})
        out.append(Veto(generation=g, task=task, episode=str(ep), reasons=reasons, classes=classes))
    return out


def guard_counts(vetoes: list[Veto], reviews: list[Review] = ()) -> list[GuardCount]:
    tally = Counter((v.generation, c) for v in vetoes for c in v.classes)
    tally.update((r.generation, "flagged for review") for r in reviews if r.held)
    return [GuardCount(generation=g, guard=c, episodes=n) for (g, c), n in sorted(tally.items())]


def guard_reviews(doc: dict, g: int, task: str) -> list[Review]:
    vetoed = set(doc.get("vetoed", []))
    return [Review(generation=g, task=task, episode=str(ep), vetoed=ep in vetoed, claims=list(e["review"]),
                   held=bool(e.get("held")),
                   trained=ep not in vetoed and bool(e.get("eligible")) and not e.get("held"))
            for ep, e in sorted((doc.get("episodes") or {}).items()) if e.get("review")]


def stored_supervised(stats: dict | None) -> int | None:
    """Supervised tokens of the training windows (the render step's `summary`)."""
    if not stats:
        return None
    for doc in (stats.get("summary"), stats.get("train"), stats):
        if isinstance(doc, dict) and isinstance(doc.get("stored_supervised_tokens"), int):
            return doc["stored_supervised_tokens"]
    return None


def loss_curves(log: list[dict]) -> tuple[list[list[float]], list[list[float]]]:
    """(train, val) [step, loss] pairs; after a resume the later line of a step wins."""
    train: dict[int, float] = {}
    val: dict[int, float] = {}
    for line in log:
        if line.get("kind") == "val" or ("val_loss" in line and "loss" not in line):
            if line.get("val_loss") is not None:
                val[int(line["step"])] = float(line["val_loss"])
        elif line.get("loss") is not None:
            train[int(line["step"])] = float(line["loss"])
    return [[s, train[s]] for s in sorted(train)], [[s, val[s]] for s in sorted(val)]


# ---------------------------------------------------------------- building


def run_composition(spec) -> dict:

    comp = composition_of(spec.sft)
    return {"preset": comp.preset, "teacher": spec.collection.teacher, "window_roles": list(comp.roles),
            "training_episodes": comp.episodes, "orchestrator_share": round(comp.orchestrator_share, 6),
            "checkpoint_selection": comp.checkpoint}


def role_players(ctx: RunContext) -> list[RolePlayer]:

    recorded = recorded_players(ctx)
    return [RolePlayer(role=r, configured=role_label(ctx.spec, r, 0).replace("gen-0", "current generation (L_g)"),
                       recorded=recorded[r]) for r in ROLES]


def rollout_grades(store, audit_keys: list[tuple[str, str]], tasks: dict) -> list[tuple[str, object]]:
    """(task, Grade) of each bare-prompt rollout whose task has deliverables, from its stored workspace."""
    import tempfile
    from pathlib import Path


    out = []
    for task_id, key in audit_keys:  # (task, key of the rollout's audit.json)
        task = tasks.get(task_id)
        ws_key = key.removesuffix("audit.json") + "workspace.tar.gz"
        if task is None or not task.deliverables or not store.exists(ws_key):
            continue
        with tempfile.TemporaryDirectory(prefix="mass-grade-") as tmp:
            out.append((task.id, grade_workspace(task, store.get_dir(ws_key, Path(tmp) / "ws"))))
    return out


def task_scores(grades: list) -> dict:
    scores = [g.score for g in grades if g.score is not None]
    return {"graded": len(scores), "task_score": sum(scores) / len(scores) if scores else None,
            "solved": sum(g.solved for g in grades)}


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
            out.append(WinShare(candidate=cand, baseline=base, split=split, **summary, positions=positions,
                                note=metrics.position_bias_note(positions)))
    return out


def _audits(ctx: RunContext, tasks, split_of: dict[str, str]) -> list:
    """The behaviour audit and task scores of each generation's bare-prompt rollouts, per split."""
    store, out = ctx.store, []
    rollout_audits = [(ctx.eval_rollout_of(k), k) for k in store.list(ctx.eval_root() + "/") if k.endswith("/audit.json")]
    rollout_audits = [(where, k) for where, k in rollout_audits if where is not None]
    for h in sorted({where[0] for where, _ in rollout_audits}):
        audits = [(where[1], store.get_json(k)) for where, k in rollout_audits if where[0] == h]
        grades = rollout_grades(store, [(where[1], k) for where, k in rollout_audits if where[0] == h],
                                {t.id: t for t in tasks})
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
    network = None if not online else NetworkCounts(
        episodes=len(online), **{k: sum(int(n.get(k, 0)) for n in online) for k in ("requests", "allowed", "denied", "bytes_down")},
        hosts=sorted({h for n in online for h in n.get("hosts", [])}))
    return Outcomes(generation=g, stage=stage, episodes=len(sts), network=network,
                    by_outcome={o: counted.get(o, 0) for o in (*OUTCOMES, *sorted(set(counted) - set(OUTCOMES)))},
                    by_cap={c: capped.get(c, 0) for c in CAPS},
                    tool_calls=calls, tool_calls_per_episode=round(calls / len(sts), 3),
                    unsandboxed=sum((st.get("sandbox") or {}).get("boundary") == "none" for st in sts),
                    ended_by_pod=dict(sorted(Counter(st["_task"] for st in sts if st.get("ended_by") == "pod").items())))


def _add_generation(rows: _Rows, ctx: RunContext, g: int, train: list[str]) -> None:
    """Generation g's rows: episode outcomes and tokens, SFT data, training, search, guards, ranking."""
    store, spec = ctx.store, ctx.spec
    st_eval, st_search = _statuses(store, ctx.eval(g)), _statuses(store, ctx.search_root(g))
    st_collect = _statuses(store, ctx.collect_root(g))
    gen_eval, gen_search, gen_collect = map(metrics.generated_tokens, (st_eval, st_search, st_collect))
    rows.outcomes += [_stage_outcomes(g, stage, sts) for stage, sts in
                      (("search", st_search), ("collect", st_collect), ("evaluate", st_eval)) if sts]
    stats = _json_or_none(store, ctx.sft_file(g, "stats"))
    if sft_data(stats, g):
        rows.sft.append(sft_data(stats, g))
    log = _jsonl(store, ctx.train_log(g))
    select_doc = _json_or_none(store, ctx.select(g))
    chosen = selected_step(select_doc)
    processed = metrics.processed_tokens([x for x in log if x.get("kind", "train") == "train"], chosen)
    if gen_eval or gen_search or gen_collect or stats or log:
        rows.tokens.append(Tokens(
            generation=g, generated_search=gen_search, generated_collect=gen_collect, generated_eval=gen_eval,
            generated_total=gen_search + gen_collect + gen_eval,
            generated_episodes=len(st_eval) + len(st_search) + len(st_collect), stored_supervised=stored_supervised(stats),
            processed_to_selected=processed["to_selected"], processed_to_end=processed["to_end"] if log else None))
    if log or chosen is not None:
        train_loss, val_loss = loss_curves(log)
        rows.training.append(Training(generation=g, selected_step=chosen, train_loss=train_loss, val_loss=val_loss,
                                      selected_by=(select_doc or {}).get("by", "val_loss") if chosen is not None else None))
    states = {t: _json_or_none(store, ctx.search_state(g, t)) for t in train}
    states = {t: s for t, s in states.items() if s}
    if states:
        beats = {t: elite_beats_by_iteration(s) for t, s in states.items()}
        rows.search.append(SearchCurve(generation=g, iterations=spec.search.iterations, tasks=len(states),
                                       coverage=metrics.search_coverage(beats, spec.search.iterations),
                                       beats_reference={t: bool(s.get("beats_reference")) for t, s in states.items()}))
    for t in train:
        doc = _json_or_none(store, ctx.guard(g, t))
        if doc:
            rows.vetoes += guard_vetoes(doc, g, t)
            rows.reviews += guard_reviews(doc, g, t)
        rows.ranked += (_json_or_none(store, ctx.rank(g, t)) or {}).get("verdicts") or []


def build_report(ctx: RunContext, embedder=None) -> dict:
    """report.json content (without `files`), computed from the store alone (`embedder`: of the
    workflow information proxies; the built-in hash embedder when None)."""

    spec, store = ctx.spec, ctx.store
    tasks = spec.resolved_tasks()
    split_of = {t.id: t.split for t in tasks}
    by_split = {"train": [t.id for t in tasks if t.split == "train"], "test": [t.id for t in tasks if t.split == "test"]}
    ev = spec.evaluation
    evaluated = evaluated_generations(ctx)
    verdicts = load_verdicts(store, ctx.verdicts())
    panel = [v for v in verdicts if v.get("kind") == "panel"]
    own = [v for v in verdicts if v.get("kind") == "self"]

    win_share = _win_share(panel, split_of, ev)
    agreement = [Agreement(evaluator=h, **metrics.agreement([v for v in own if v["judge"] == f"gen-{h}"], panel))
                 for h in sorted({int(v["judge"].removeprefix("gen-")) for v in own})]
    audit = _audits(ctx, tasks, split_of)
    rows = _Rows()
    for g in range(spec.generations + 1):
        _add_generation(rows, ctx, g, by_split["train"])
    invalid = [InvalidVerdict(candidate=v["candidate"], baseline=v["baseline"], task=v["task"],
                              replicate=v["replicate"], judge=v["judge"], seed=v["seed"], errors=v.get("errors", []))
               for v in panel if not v.get("valid")]
    count = lambda vs: VerdictCounts(total=len(vs), valid=sum(bool(v.get("valid")) for v in vs),  # noqa: E731
                                     invalid=sum(not v.get("valid") for v in vs))
    doc = Report(
        run=ctx.run, how_to_read=[], generations=spec.generations, evaluated=evaluated, tasks=by_split, confidence=ev.confidence,
        intervals={"per_task": "wilson score interval",
                   "overall": f"percentile bootstrap over tasks, {ev.bootstrap} resamples, seed 0"},
        judges=[JudgeInfo(name=j.name, model=j.model, seeds=list(j.seeds)) for j in spec.judges],
        verdicts={"panel": count(panel), "self": count(own), "rank": count(rows.ranked)},
        win_share=win_share, agreement=agreement, audit=audit, tokens=rows.tokens, outcomes=rows.outcomes, sft=rows.sft,
        search=rows.search, guard_vetoes=rows.vetoes, guard_counts=guard_counts(rows.vetoes, rows.reviews),
        review=rows.reviews, training=rows.training,
        invalid_verdicts=invalid, files=[],
        information=workflow_information(ctx, embedder), roles=role_players(ctx), composition=run_composition(spec),
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
    return Step(ctx.store, ctx.report(), {"spec": ctx.spec.model_dump(mode="json", exclude={"store"}),
                                          "stored": stored}, name="report")


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
