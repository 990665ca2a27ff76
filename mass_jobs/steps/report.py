"""The run report, rebuilt from stored artifacts alone: `<run>/report/{report.json,report.md,*.png}`.

    mass report --spec S

Reads only the store (verdicts, eval rollouts and their audits, search states, guard verdicts,
SFT stats, training logs, selection) and recomputes every number with `mass_jobs.metrics`, so the
report of a resumed run equals the report of an uninterrupted one whenever the stored artifacts do.
report.json is validated against schemas/report.schema.json (generated from `Report` below).
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
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs import metrics
from mass_jobs.analysis.information import InformationProxy
from mass_jobs.context import RunContext
from mass_jobs.harness import CAPS, OUTCOMES, episode_cap
from mass_jobs.models import Closed

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "report.schema.json"
PLOTS = ("win_share.png", "search.png", "loss.png", "audit.png", "tokens.png", "information.png")
Split = Literal["train", "test", "all"]


# ---------------------------------------------------------------- the document (source of the schema)


class TaskShare(Closed):
    wins: int
    losses: int
    ties: int
    invalid: int
    win_share: float | None
    ci: list[float] | None = Field(description="Wilson score interval [lo, hi]; null without decisive verdicts.")


class WinShare(Closed):
    candidate: int = Field(description="Generation g of L_g.")
    baseline: int = Field(description="The generation it is compared with (0 or g-1).")
    split: Split
    wins: int
    losses: int
    ties: int
    invalid: int
    win_share: float | None = Field(description="wins / (wins + losses), ties and invalid verdicts excluded.")
    ci: list[float] | None = Field(description="Bootstrap-over-tasks percentile interval [lo, hi].")
    per_task: dict[str, TaskShare]
    positions: dict[str, int] = Field(
        description="Decisive verdicts by the blind label chosen ('A', 'B') and by the order shown "
                    "('candidate_first', 'baseline_first').")
    note: str | None = Field(description="Position-bias note when every decisive verdict chose one label.")


class Agreement(Closed):
    evaluator: int = Field(description="Generation whose own model gave the self verdicts.")
    agree: int
    pairs: int = Field(description="Pairs with a valid self verdict and a panel majority.")
    no_majority: int = Field(
        description="Pairs with a valid self verdict whose panel has no majority: neither agreement nor disagreement.")
    rate: float | None


class Audit(Closed):
    generation: int
    split: Split
    episodes: int
    delegation: int
    code_handoff: int
    delegation_rate: float | None
    code_handoff_rate: float | None
    graded: int = Field(default=0, description="Episodes with a deterministic task score (tasks with deliverables).")
    task_score: float | None = Field(
        default=None, description="Mean task score (mass_jobs.grade: deliverables exist and are correct), 0..1.")
    solved: int = Field(default=0, description="Episodes whose every grader check passed.")


class Tokens(Closed):
    generation: int
    generated_search: int
    generated_collect: int
    generated_eval: int
    generated_total: int
    generated_episodes: int = Field(description="Episode status records whose completion tokens are summed.")
    stored_supervised: int | None = Field(description="Supervised tokens in the rendered SFT windows.")
    processed_to_selected: int | None = Field(description="Supervised tokens processed up to the selected step.")
    processed_to_end: int | None


class Outcomes(Closed):
    generation: int
    stage: Literal["search", "collect", "evaluate"]
    episodes: int
    by_outcome: dict[str, int] = Field(description="Episodes per outcome (mass_jobs.harness.OUTCOMES; turn_limit: an "
                                                   "agent used its turns, e.g. qwen-code's --max-session-turns).")
    by_cap: dict[str, int] = Field(default_factory=dict, description="Episodes ended by each cap of execution.limits "
                                   "(mass_jobs.harness.CAPS), zeros included: a cap ending many episodes selects for brevity.")


class SftData(Closed):
    generation: int
    episodes: int = Field(description="Ranked episodes the render step read (train and val).")
    episode_errors: int = Field(
        description="Errors found in them: teacher prompt not stripped, thread not renderable, reply too long.")
    episodes_dropped: int = Field(description="Episodes left out of the SFT data for those errors (sft.strict).")
    orchestrator_windows: int = Field(description="Training windows of orchestrator threads.")
    windows_by_role: dict[str, int] = Field(default_factory=dict, description="Training windows per thread role "
                                            "(orchestrator, worker, auxiliary: a harness's side calls).")
    supervised_by_role: dict[str, int] = Field(default_factory=dict, description="Supervised tokens of the training "
                                               "windows per thread role.")


def sft_data(stats: dict | None, g: int) -> SftData | None:
    """What the render step of generation g kept and dropped (sft/stats.json), or None before it ran."""
    splits = [stats.get(s) for s in ("train", "val")] if stats else []
    splits = [x for x in splits if isinstance(x, dict) and "episodes" in x]
    if not splits:
        return None
    return SftData(generation=g, episodes=sum(x["episodes"] for x in splits),
                   episode_errors=sum(len(x.get("episode_errors", [])) for x in splits),
                   episodes_dropped=sum(len(x.get("episodes_dropped", [])) for x in splits),
                   orchestrator_windows=(stats["train"].get("windows_by_role") or {}).get("orchestrator", 0),
                   windows_by_role=dict(stats["train"].get("windows_by_role") or {}),
                   supervised_by_role=dict(stats["train"].get("supervised_tokens_by_role") or {}))


class SearchCurve(Closed):
    generation: int
    iterations: int
    tasks: int
    coverage: list[int] = Field(description="Tasks whose elite beat the bare reference after iteration k.")
    beats_reference: dict[str, bool] = Field(description="Per task, the final elite vs the reference.")


class Veto(Closed):
    generation: int
    task: str
    episode: str
    reasons: list[str]


class Training(Closed):
    generation: int
    selected_step: int | None
    selected_by: Literal["val_loss", "panel"] | None = Field(default=None, description="How the step was selected.")
    train_loss: list[list[float]] = Field(description="[step, loss] pairs.")
    val_loss: list[list[float]] = Field(description="[step, validation loss] pairs.")


class VerdictCounts(Closed):
    total: int
    valid: int
    invalid: int


class InvalidVerdict(Closed):
    candidate: int
    baseline: int
    task: str
    replicate: int
    judge: str
    seed: int
    errors: list[str]


class JudgeInfo(Closed):
    name: str
    model: str
    seeds: list[int]


class RolePlayer(Closed):
    role: str = Field(description="optimizer | evaluator | executor")
    configured: str = Field(description="roles.<role> of the spec: `<model> @ <endpoint>`, or the current generation.")
    recorded: list[str] = Field(description="Models recorded as playing it in stored proposals, verdicts and episodes.")


class Report(Closed):
    """report.json of one run."""

    run: str
    how_to_read: list[str] = Field(description="What the numbers are and which of them, at this scale, are noise.")
    generations: int = Field(description="N of the spec.")
    evaluated: list[int] = Field(description="Generations with a finished evaluate step.")
    tasks: dict[str, list[str]] = Field(description="Task ids by split ('train', 'test').")
    confidence: float
    intervals: dict[str, str]
    judges: list[JudgeInfo]
    verdicts: dict[str, VerdictCounts] = Field(description="'panel' and 'self' verdict counts.")
    win_share: list[WinShare]
    agreement: list[Agreement]
    audit: list[Audit]
    tokens: list[Tokens]
    outcomes: list[Outcomes] = Field(default_factory=list, description="Per generation and stage: how episodes ended.")
    sft: list[SftData] = Field(description="Per generation: episodes rendered, their errors and those dropped.")
    search: list[SearchCurve]
    guard_vetoes: list[Veto]
    training: list[Training]
    invalid_verdicts: list[InvalidVerdict]
    roles: list[RolePlayer] = Field(default_factory=list, description="Which model played which role.")
    composition: dict[str, Any] = Field(default_factory=dict, description="The teacher and its SFT composition "
                                        "(sft.preset or the spec's own fields; docs/composition.md).")
    information: list[InformationProxy] = Field(
        default_factory=list, description="Per generation, Gaussian MI/TC proxies between workflow text and results.")
    files: list[str] = Field(description="Files of the report directory.")


def report_schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://mass-jobs.dev/schemas/report.schema.json",
        **Report.model_json_schema(mode="validation"),
    }


def validate_report(doc: dict) -> None:
    """Raise ValueError naming every field of `doc` that breaks the checked-in report schema."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"$.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]
        raise ValueError("report.json does not match report.schema.json:\n" + "\n".join(lines))


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
    """Episode statuses under prefix; an agent pod's input/ and output/ copies (collect episodes,
    search and evaluate rollouts) are not episodes (ingest promotes output/ to the rollout's own
    files, which are counted)."""
    return [store.get_json(k) for k in store.list(prefix + "/")
            if k.endswith("/status.json") and not RunContext.is_pod_copy(k)]


def evaluated_generations(ctx: RunContext) -> list[int]:
    from mass_jobs.store import read_manifest

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
    return [Veto(generation=g, task=task, episode=str(ep), reasons=[str(r) for r in episodes.get(ep, {}).get("reasons", [])])
            for ep in doc.get("vetoed", [])]


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
    from mass_jobs.composition import composition_of

    comp = composition_of(spec.sft)
    return {"preset": comp.preset, "teacher": spec.collection.teacher, "window_roles": list(comp.roles),
            "training_episodes": comp.episodes, "orchestrator_share": round(comp.orchestrator_share, 6),
            "checkpoint_selection": comp.checkpoint}


def role_players(ctx: RunContext) -> list[RolePlayer]:
    from mass_jobs.roles import ROLES, recorded_players, role_label

    recorded = recorded_players(ctx)
    return [RolePlayer(role=r, configured=role_label(ctx.spec, r, 0).replace("gen-0", "current generation (L_g)"),
                       recorded=recorded[r]) for r in ROLES]


def rollout_grades(store, audit_keys: list[tuple[str, str]], tasks: dict) -> list[tuple[str, object]]:
    """(task, Grade) of each bare-prompt rollout whose task has deliverables, from its stored workspace."""
    import tempfile
    from pathlib import Path

    from mass_jobs.grade import grade_workspace

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


def build_report(ctx: RunContext, embedder=None) -> dict:
    """report.json content (without `files`), computed from the store alone (`embedder`: of the
    workflow information proxies; the built-in hash embedder when None)."""
    from mass_jobs.analysis.information import workflow_information
    from mass_jobs.judges import load_verdicts

    spec, store = ctx.spec, ctx.store
    tasks = spec.resolved_tasks()
    split_of = {t.id: t.split for t in tasks}
    by_split = {"train": [t.id for t in tasks if t.split == "train"], "test": [t.id for t in tasks if t.split == "test"]}
    ev = spec.evaluation
    evaluated = evaluated_generations(ctx)
    verdicts = load_verdicts(store, ctx.verdicts())
    panel = [v for v in verdicts if v.get("kind") == "panel"]
    own = [v for v in verdicts if v.get("kind") == "self"]

    win_share = []
    for cand, base in sorted({(v["candidate"], v["baseline"]) for v in panel}):
        vs = [v for v in panel if v["candidate"] == cand and v["baseline"] == base]
        for split in ("train", "test", "all"):
            ids = [t for t in split_of if split == "all" or split_of[t] == split]
            if not ids:
                continue
            summary = metrics.comparison_summary(metrics.compare(vs, ids), ev.confidence, ev.bootstrap, seed=0)
            positions = metrics.position_counts([v for v in vs if v["task"] in ids])
            win_share.append(WinShare(candidate=cand, baseline=base, split=split, **summary, positions=positions,
                                      note=metrics.position_bias_note(positions)))

    agreement = []
    for h in sorted({int(v["judge"].removeprefix("gen-")) for v in own}):
        mine = [v for v in own if v["judge"] == f"gen-{h}"]
        agreement.append(Agreement(evaluator=h, **metrics.agreement(mine, panel)))

    audit, tokens, search, vetoes, training, sft, outcomes = [], [], [], [], [], [], []
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
                audit.append(Audit(generation=h, split=split, **metrics.audit_rates(chosen), **task_scores(scored)))

    for g in range(spec.generations + 1):
        st_eval, st_search = _statuses(store, ctx.eval(g)), _statuses(store, ctx.search_root(g))
        st_collect = _statuses(store, ctx.collect_root(g))
        gen_eval, gen_search, gen_collect = map(metrics.generated_tokens, (st_eval, st_search, st_collect))
        for stage, sts in (("search", st_search), ("collect", st_collect), ("evaluate", st_eval)):
            if sts:
                counted = Counter(str(st.get("outcome")) for st in sts)
                capped = Counter(episode_cap(st) for st in sts)
                outcomes.append(Outcomes(generation=g, stage=stage, episodes=len(sts),
                                         by_outcome={o: counted.get(o, 0) for o in (*OUTCOMES, *sorted(set(counted) - set(OUTCOMES)))},
                                         by_cap={c: capped.get(c, 0) for c in CAPS}))
        stats = _json_or_none(store, ctx.sft_file(g, "stats"))
        if sft_data(stats, g):
            sft.append(sft_data(stats, g))
        log = _jsonl(store, ctx.train_log(g))
        select_doc = _json_or_none(store, ctx.select(g))
        chosen = selected_step(select_doc)
        processed = metrics.processed_tokens([x for x in log if x.get("kind", "train") == "train"], chosen)
        if gen_eval or gen_search or gen_collect or stats or log:
            tokens.append(Tokens(
                generation=g, generated_search=gen_search, generated_collect=gen_collect, generated_eval=gen_eval,
                generated_total=gen_search + gen_collect + gen_eval,
                generated_episodes=len(st_eval) + len(st_search) + len(st_collect), stored_supervised=stored_supervised(stats),
                processed_to_selected=processed["to_selected"], processed_to_end=processed["to_end"] if log else None))
        if log or chosen is not None:
            train_loss, val_loss = loss_curves(log)
            training.append(Training(generation=g, selected_step=chosen, train_loss=train_loss, val_loss=val_loss,
                                     selected_by=(select_doc or {}).get("by", "val_loss") if chosen is not None else None))

        states = {t: _json_or_none(store, ctx.search_state(g, t)) for t in by_split["train"]}
        states = {t: s for t, s in states.items() if s}
        if states:
            beats = {t: elite_beats_by_iteration(s) for t, s in states.items()}
            search.append(SearchCurve(generation=g, iterations=spec.search.iterations, tasks=len(states),
                                      coverage=metrics.search_coverage(beats, spec.search.iterations),
                                      beats_reference={t: bool(s.get("beats_reference")) for t, s in states.items()}))
        for t in by_split["train"]:
            doc = _json_or_none(store, ctx.guard(g, t))
            if doc:
                vetoes += guard_vetoes(doc, g, t)

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
        verdicts={"panel": count(panel), "self": count(own)},
        win_share=win_share, agreement=agreement, audit=audit, tokens=tokens, outcomes=outcomes, sft=sft, search=search,
        guard_vetoes=vetoes, training=training, invalid_verdicts=invalid, files=[],
        information=workflow_information(ctx, embedder), roles=role_players(ctx), composition=run_composition(spec),
    ).model_dump(mode="json")
    doc["how_to_read"] = how_to_read(doc)
    return doc


def how_to_read(doc: dict) -> list[str]:
    """The report's opening: what each number is, its n here, and which of them are noise at this n."""
    rows = [w for w in doc["win_share"] if w["split"] == "all"]
    open_ci = [w for w in rows if w["ci"] and w["ci"][0] <= 0.5 <= w["ci"][1]]
    undecided = [w for w in rows if not w["ci"]]
    biased = [w for w in rows if w["note"]]
    n_dec = sorted({w["wins"] + w["losses"] for w in rows})
    lines = [
        "Every number below is a count over a small sample and says its n; at this scale one verdict or one "
        "episode moves a rate by 1/n, so read the counts before the percentages.",
        "Win share is the candidate's wins / (wins + losses) by the judge panel; 50% is no difference. "
        + (f"{len(open_ci)} of {len(rows)} comparisons (all tasks, n = {', '.join(map(str, n_dec))} decisive "
           f"verdicts) have an interval that contains 50%: those are indistinguishable from noise."
           + (f" {len(undecided)} have no decisive verdict at all." if undecided else "")
           if rows else "No comparison has been judged yet."),
    ]
    if biased:
        lines.append(f"{len(biased)} of {len(rows)} comparisons have a judge that chose the same position in every "
                     "decisive verdict (position-bias note): over position-balanced pairs their win share is 50% "
                     "by construction and measures the judge, not the generations.")
    no_maj = sum(a["no_majority"] for a in doc["agreement"])
    counted = sum(a["pairs"] for a in doc["agreement"])
    lines.append("Evaluator agreement counts only pairs on which the panel has a majority "
                 f"({counted} here); {no_maj} pairs had no majority and are reported as such, "
                 "neither agreement nor disagreement.")
    episodes = sorted({a["episodes"] for a in doc["audit"] if a["split"] == "all"})
    lines.append("Delegation D and code handoff H count bare-prompt episodes "
                 f"(n = {', '.join(map(str, episodes)) or '0'} per generation); a difference of one or two "
                 "episodes between generations is within sampling noise at this n.")
    graded = sorted({a.get("graded", 0) for a in doc["audit"] if a["split"] == "all"})
    if any(graded):
        lines.append("Task score is a deterministic grader (each deliverable exists, each expected file is correct), "
                     f"no judge involved (n = {', '.join(map(str, graded))} graded episodes per generation): it moves "
                     "only when workspaces change, so beside a noisy win share it says whether work got done.")
    lines.append("Training loss of a small model over few steps shows that optimisation ran, not that the next "
                 "generation is better; the win share and the audit are the evidence for that.")
    return lines


# ---------------------------------------------------------------- rendering


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:.1f}%"
    return f"{x:,}" if isinstance(x, int) else f"{x:.4g}"


def _ci(ci) -> str:
    return "–" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _by_role(counts: dict | None) -> str:
    return ", ".join(f"{role} {n:,}" for role, n in (counts or {}).items()) or "-"


def render_markdown(doc: dict) -> str:
    lines = [f"# MASS run `{doc['run']}`", "", "## How to read this", "",
             *[f"- {line}" for line in doc["how_to_read"]], "",
             f"Generations: {doc['generations']} (evaluated: {', '.join(f'L{g}' for g in doc['evaluated']) or 'none'}). "
             f"Train tasks: {', '.join(doc['tasks']['train']) or '–'}; test tasks: {', '.join(doc['tasks']['test']) or '–'}.",
             f"Judges: {', '.join(j['name'] + ' (' + j['model'] + ', seeds ' + str(j['seeds']) + ')' for j in doc['judges']) or 'none'}.",
             "", "## Win share (panel)", "",
             f"wins / (wins + losses), ties and invalid verdicts excluded. {int(100 * doc['confidence'])}% intervals: "
             f"per task {doc['intervals']['per_task']}; overall {doc['intervals']['overall']}.", "",
             "| comparison | split | wins | losses | ties | invalid | win share | CI | note |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for w in doc["win_share"]:
        pos, n = w["positions"], w["positions"]["A"] + w["positions"]["B"]
        note = f"position bias: {n}/{n} chose {'A' if pos['A'] else 'B'}" if w["note"] else ""
        lines.append(f"| L{w['candidate']} vs L{w['baseline']} | {w['split']} | {w['wins']} | {w['losses']} | {w['ties']} "
                     f"| {w['invalid']} | {_fmt(w['win_share'], True)} | {_ci(w['ci'])} | {note} |")
    if any(w["note"] for w in doc["win_share"]):
        lines += ["", "Position bias: every decisive verdict of the comparison chose the same blind label although "
                  "the pairs were shown in both orders, so its win share measures the judge's order preference, "
                  "not the workspaces."]
    lines += ["", "### Per task", "", "| comparison | task | wins | losses | ties | invalid | win share | Wilson CI |",
              "|---|---|---:|---:|---:|---:|---:|---|"]
    for w in doc["win_share"]:
        if w["split"] != "all":
            continue
        for task, t in w["per_task"].items():
            lines.append(f"| L{w['candidate']} vs L{w['baseline']} | {task} | {t['wins']} | {t['losses']} | {t['ties']} "
                         f"| {t['invalid']} | {_fmt(t['win_share'], True)} | {_ci(t['ci'])} |")
    v = doc["verdicts"]
    lines += ["", f"Verdicts: panel {v['panel']['total']} ({v['panel']['invalid']} invalid), "
              f"self-evaluator {v['self']['total']} ({v['self']['invalid']} invalid).", "",
              "## Evaluator agreement with the panel majority", "",
              "A pair counts when the self-evaluator gave a valid verdict and more than half of the panel's valid "
              "verdicts made the same call; a split panel is 'no majority', neither agreement nor disagreement.", "",
              "| evaluator | agree | pairs with a majority | no majority | rate |", "|---|---:|---:|---:|---:|"]
    for a in doc["agreement"]:
        rate = _fmt(a["rate"], True) if a["pairs"] else f"no majority: {a['no_majority']}" if a["no_majority"] else "–"
        lines.append(f"| L{a['evaluator']} | {a['agree']} | {a['pairs']} | {a['no_majority']} | {rate} |")
    lines += ["", "## Behaviour audit (bare-prompt runs)", "",
              "Task score: the deterministic grader's share of checks passed (each deliverable exists, each expected "
              "file is correct), averaged over graded episodes; solved: every check passed.", "",
              "| generation | split | episodes | delegation D | code handoff H | task score | solved |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for a in doc["audit"]:
        lines.append(f"| L{a['generation']} | {a['split']} | {a['episodes']} | {a['delegation']}/{a['episodes']} "
                     f"| {a['code_handoff']}/{a['episodes']} | {_fmt(a.get('task_score'), True)} "
                     f"| {a.get('solved', 0)}/{a.get('graded', 0)} |")
    lines += ["", "## Tokens", "", "| generation | episodes | generated (search / collect / eval) | stored supervised "
              "| processed to selected | processed to end |", "|---|---:|---|---:|---:|---:|"]
    for t in doc["tokens"]:
        lines.append(f"| L{t['generation']} | {t['generated_episodes']} | {_fmt(t['generated_total'])} "
                     f"({_fmt(t['generated_search'])} / "
                     f"{_fmt(t['generated_collect'])} / {_fmt(t['generated_eval'])}) | {_fmt(t['stored_supervised'])} "
                     f"| {_fmt(t['processed_to_selected'])} | {_fmt(t['processed_to_end'])} |")
    if len(doc["tokens"]) > 1:  # the run's own accounting: every generation together
        total = lambda k: sum(t[k] or 0 for t in doc["tokens"]) if any(t[k] is not None for t in doc["tokens"]) else None  # noqa: E731
        lines.append(f"| run | {total('generated_episodes')} | {_fmt(total('generated_total'))} "
                     f"({_fmt(total('generated_search'))} / {_fmt(total('generated_collect'))} / "
                     f"{_fmt(total('generated_eval'))}) | {_fmt(total('stored_supervised'))} "
                     f"| {_fmt(total('processed_to_selected'))} | {_fmt(total('processed_to_end'))} |")
    if doc.get("outcomes"):
        names = [o for o in OUTCOMES if any(x["by_outcome"].get(o) for x in doc["outcomes"])] or ["success"]
        lines += ["", "## Episode outcomes", "", "| generation | stage | episodes | " + " | ".join(names) + " |",
                  "|---|---|---:|" + "---:|" * len(names)]
        for x in doc["outcomes"]:
            lines.append(f"| L{x['generation']} | {x['stage']} | {x['episodes']} | "
                         + " | ".join(str(x["by_outcome"].get(o, 0)) for o in names) + " |")
        lines += ["", "Episodes ended by a cap of `execution.limits`:", "",
                  "| generation | stage | " + " | ".join(CAPS) + " |", "|---|---|" + "---:|" * len(CAPS)]
        lines += [f"| L{x['generation']} | {x['stage']} | " + " | ".join(str(x.get("by_cap", {}).get(c, 0)) for c in CAPS)
                  + " |" for x in doc["outcomes"]]
    if doc["sft"]:
        lines += ["", "## SFT data", "", "| generation | episodes | episode errors | episodes dropped | orchestrator windows "
                  "| windows by role | supervised tokens by role |", "|---|---:|---:|---:|---:|---|---|"]
        lines += [f"| L{d['generation']} | {d['episodes']} | {d['episode_errors']} | {d['episodes_dropped']} "
                  f"| {d['orchestrator_windows']} | {_by_role(d.get('windows_by_role'))} "
                  f"| {_by_role(d.get('supervised_by_role'))} |" for d in doc["sft"]]
    lines += ["", "## Workflow search", "", "| generation | tasks | elite beats reference after iteration k |",
              "|---|---:|---|"]
    for s in doc["search"]:
        lines.append(f"| L{s['generation']} | {s['tasks']} | {' '.join(map(str, s['coverage']))} |")
    lines += ["", "## Training", "", "| generation | selected step | last train loss | best val loss |",
              "|---|---:|---:|---:|"]
    for t in doc["training"]:
        last = t["train_loss"][-1][1] if t["train_loss"] else None
        best = min((x[1] for x in t["val_loss"]), default=None)
        by = " (panel)" if t.get("selected_by") == "panel" else ""
        lines.append(f"| L{t['generation']} | {_fmt(t['selected_step'])}{by} | {_fmt(last)} | {_fmt(best)} |")
    lines += ["", f"## Guard vetoes ({len(doc['guard_vetoes'])})", ""]
    for x in doc["guard_vetoes"]:
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}: {'; '.join(x['reasons']) or 'vetoed'}")
    lines += ["", f"## Invalid panel verdicts ({len(doc['invalid_verdicts'])})", ""]
    for x in doc["invalid_verdicts"]:
        why = x["errors"][-1] if x["errors"] else "no reason recorded"
        lines.append(f"- L{x['candidate']} vs L{x['baseline']} {x['task']} rep {x['replicate']} {x['judge']} "
                     f"seed {x['seed']}: {why}")
    comp = doc.get("composition") or {}
    if comp:
        lines += ["", "## Teacher composition", "",
                  f"preset {comp['preset'] or '– (the spec fields)'}; teacher {comp['teacher']}; windows of "
                  f"{', '.join(comp['window_roles'])} from {comp['training_episodes']} ranked episodes; orchestrator "
                  f"share {comp['orchestrator_share']:.3f}; checkpoint by "
                  f"{'the judge panel' if comp['checkpoint_selection'] == 'panel' else 'validation loss'}."]
    lines += ["", "## Roles", "", "| role | configured | recorded in proposals, verdicts, episodes |", "|---|---|---|"]
    lines += [f"| {r['role']} | {r['configured']} | {', '.join(r['recorded']) or '–'} |" for r in doc.get("roles", [])]
    lines += ["", "## Workflow information (Gaussian proxies)", "",
              "Search rollouts' workflow text, embedded locally, against their outcome (success) and verdict (won its "
              "comparison), in nats, computed as if jointly Gaussian: proxies of dependence, not exact information. "
              "'within': task means removed first.", "",
              "| generation | embedder | rollouts | tasks | dims | I(E;outcome) | I(E;verdict) | TC | dims within "
              "| I(E;outcome) within | I(E;verdict) within | TC within |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in doc.get("information", []):
        lines.append(f"| L{x['generation']} | {x['embedder']} | {x['samples']} | {x['tasks']} | " + " | ".join(
            _fmt(x[k]) for k in ("dims", "mi_outcome", "mi_verdict", "tc", "dims_within", "mi_outcome_within",
                                 "mi_verdict_within", "tc_within")) + " |")
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def figures(doc: dict) -> list[tuple[str, Any]]:
    """The report's plots as (file name, matplotlib figure), each saying its n in its texts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    series = [(b, s) for b in ("L0", "prev") for s in ("train", "test")]
    for i, (base_kind, split) in enumerate(series):
        marker, color = {"L0": "o", "prev": "s"}[base_kind], {"train": "tab:blue", "test": "tab:orange"}[split]
        pts = [w for w in doc["win_share"] if w["split"] == split and w["win_share"] is not None
               and ((w["baseline"] == 0) == (base_kind == "L0"))]
        if not pts:
            continue
        dx = (i - 1.5) * 0.14  # side by side, so series at one generation do not hide each other
        xs = [w["candidate"] + dx for w in pts]
        ys = [w["win_share"] for w in pts]
        err = [[y - (w["ci"] or [y, y])[0] for y, w in zip(ys, pts)], [(w["ci"] or [y, y])[1] - y
                                                                        for y, w in zip(ys, pts)]]
        ax.errorbar(xs, ys, yerr=err, marker=marker, color=color, capsize=3, ls="none",
                    mfc="white" if any(w["note"] for w in pts) else color, label=f"{split} vs {base_kind}")
        for x, y, w in zip(xs, ys, pts):  # n to the right: clear of the vertical error bars
            ax.annotate(f"n={w['wins'] + w['losses']}", (x, y), textcoords="offset points", xytext=(5, 0),
                        ha="left", va="center", fontsize=7, color=color,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})  # readable on the 50% line
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    gens = doc.get("evaluated") or [1]
    p = doc["verdicts"]["panel"]
    ax.set(xlabel="generation", ylabel="win share (wins / decisive)", ylim=(-0.05, 1.05),
           title=f"Win share by generation (panel, {p['valid']} valid of {p['total']} verdicts;\n"
                 "n = decisive verdicts per point, hollow = position-biased judge)",
           xlim=(min(gens) - 0.5, max(gens) + 0.5))
    ax.title.set_fontsize(9)
    ax.set_xticks(gens, [f"L{g}" for g in gens])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    else:  # say why the plot is empty instead of showing bare axes
        ax.text(0.5, 0.7, f"no decisive panel verdict\n{p['total']} verdicts, {p['invalid']} invalid",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="dimgrey")
    figs.append(("win_share.png", fig))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s in doc["search"]:
        ax.plot(range(len(s["coverage"])), s["coverage"], marker="o", label=f"L{s['generation']} (n={s['tasks']} tasks)")
    tasks = max((s["tasks"] for s in doc["search"]), default=0)
    ax.set(xlabel="iteration", ylabel="tasks whose elite\nbeats the reference",
           title=f"Workflow search (n = {tasks} train tasks per generation)")
    if doc["search"]:  # counts of tasks: integer axes from 0 to the number of tasks
        ax.set_yticks(range(tasks + 1))
        ax.set_ylim(-0.2, tasks + 0.2)
        ax.set_xticks(range(max(len(s["coverage"]) for s in doc["search"])))
        ax.legend(fontsize=8)
    figs.append(("search.png", fig))

    n = max(1, len(doc["training"]))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.4), squeeze=False)
    processed = {t["generation"]: t["processed_to_end"] for t in doc["tokens"]}
    for ax, t in zip(axes[0], doc["training"]):
        if t["train_loss"]:
            ax.plot(*zip(*t["train_loss"]), label="train")
        if t["val_loss"]:
            ax.plot(*zip(*t["val_loss"]), marker="o", label="validation")
        if t["selected_step"] is not None:
            ax.axvline(t["selected_step"], color="red", ls="--", label=f"selected {t['selected_step']}")
        tok = processed.get(t["generation"])
        ax.set(title=f"L{t['generation']} -> L{t['generation'] + 1}\nn = {len(t['train_loss'])} steps, "
                     f"{len(t['val_loss'])} val points" + (f", {tok:,} tokens" if tok else ""),
               xlabel="step", ylabel="loss")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    if not doc["training"]:
        axes[0][0].set_title("Training (n = 0 generations trained)")
    figs.append(("loss.png", fig))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    rows = [a for a in doc["audit"] if a["split"] == "all"]
    xs = [a["generation"] for a in rows]
    for shift, key, label in ((-0.2, "delegation", "delegation D"), (0.2, "code_handoff", "code handoff H")):
        bars = ax.bar([x + shift for x in xs], [a[f"{key}_rate"] or 0 for a in rows], width=0.4, label=label)
        # counts on the bars, so a 0 is visibly a measured 0 and not a missing bar
        ax.bar_label(bars, labels=[f"{a[key]}/{a['episodes']}" for a in rows], fontsize=8)
    ax.set(xlabel="generation (n = bare-prompt episodes)", ylabel="share of bare-prompt episodes", ylim=(0, 1.15),
           title="Behaviour audit (bars: count / n)")
    ax.set_xticks(xs, [f"L{a['generation']}\nn={a['episodes']}" for a in rows])
    ax.legend(fontsize=8, loc="upper right")
    figs.append(("audit.png", fig))

    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.4 * (len(doc["tokens"]) + 1)))
    ax.axis("off")
    cols = ["gen", "n episodes", "generated", "stored supervised", "processed (selected)", "processed (end)"]
    cells = [[f"L{t['generation']}", str(t["generated_episodes"]), _fmt(t["generated_total"]),
              _fmt(t["stored_supervised"]), _fmt(t["processed_to_selected"]), _fmt(t["processed_to_end"])]
             for t in doc["tokens"]] or [["–"] * len(cols)]
    table = ax.table(cellText=cells, colLabels=cols, loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(10)
    table.auto_set_column_width(list(range(len(cols))))
    table.scale(1, 1.4)
    ax.set_title(f"Tokens (n = episodes whose output is counted, {len(doc['tokens'])} generations)")
    figs.append(("tokens.png", fig))

    from mass_jobs.analysis.information import plot_information

    fig, ax = plt.subplots(figsize=(7, 3.8))
    plot_information(doc.get("information", []), ax)
    figs.append(("information.png", fig))
    return figs


def render_plots(doc: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "mass"
    meta = {"Software": None}  # no version/date stamps: identical bytes on rebuild
    written = []
    for name, fig in figures(doc):
        fig.tight_layout()
        fig.savefig(out / name, dpi=100, metadata=meta)
        plt.close(fig)
        written.append(name)
    return written


def write_report(ctx: RunContext, embedder=None) -> dict:
    """Build, validate and store `<run>/report/` (manifest last); returns report.json's content.

    Always rebuilt (it is cheap and its inputs are the whole store); the manifest's input hash is
    the report's own content, so two runs with equal stored results have equal manifests."""
    from mass_jobs.store import Step

    doc = build_report(ctx, embedder)
    with tempfile.TemporaryDirectory(prefix="mass-report-") as tmp:
        out = Path(tmp)
        files = sorted(render_plots(doc, out) + ["report.json", "report.md"])
        doc["files"] = files
        validate_report(doc)
        (out / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (out / "report.md").write_text(render_markdown(doc))
        step = Step(ctx.store, ctx.report(), inputs=doc, name="report")
        step.start()
        for name in files:
            ctx.store.put_file(ctx.report_file(name), out / name)
        step.finish([ctx.report_file(name) for name in files])
    return doc
