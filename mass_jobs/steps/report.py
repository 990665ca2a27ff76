"""The run report, rebuilt from stored artifacts alone: `<run>/report/{report.json,report.md,*.png}`.

    mass report --spec S

Reads only the store (verdicts, eval rollouts and their audits, search states, guard verdicts,
SFT stats, training logs, selection) and recomputes every number with `mass_jobs.metrics`, so the
report of a resumed run equals the report of an uninterrupted one whenever the stored artifacts do.
report.json is validated against schemas/report.schema.json (generated from `Report` below).
No clocks, no hosts, no temp paths in the report: rebuilding it twice gives identical bytes.

Confidence intervals: per task, the Wilson score interval over that task's decisive verdicts;
overall, a percentile bootstrap that resamples TASKS (`evaluation.bootstrap` resamples, seed 0).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs import metrics
from mass_jobs.context import RunContext
from mass_jobs.models import Closed

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "report.schema.json"
PLOTS = ("win_share.png", "search.png", "loss.png", "audit.png", "tokens.png")
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


class Agreement(Closed):
    evaluator: int = Field(description="Generation whose own model gave the self verdicts.")
    agree: int
    pairs: int = Field(description="Pairs with a valid self verdict and a panel majority.")
    rate: float | None


class Audit(Closed):
    generation: int
    split: Split
    episodes: int
    delegation: int
    code_handoff: int
    delegation_rate: float | None
    code_handoff_rate: float | None


class Tokens(Closed):
    generation: int
    generated_search: int
    generated_collect: int
    generated_eval: int
    generated_total: int
    stored_supervised: int | None = Field(description="Supervised tokens in the rendered SFT windows.")
    processed_to_selected: int | None = Field(description="Supervised tokens processed up to the selected step.")
    processed_to_end: int | None


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


class Report(Closed):
    """report.json of one run."""

    run: str
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
    search: list[SearchCurve]
    guard_vetoes: list[Veto]
    training: list[Training]
    invalid_verdicts: list[InvalidVerdict]
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
    return [store.get_json(k) for k in store.list(prefix + "/") if k.endswith("/status.json")]


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


def build_report(ctx: RunContext) -> dict:
    """report.json content (without `files`), computed from the store alone."""
    from mass_jobs.judges import load_verdicts

    spec, store = ctx.spec, ctx.store
    tasks = spec.resolved_tasks()
    split_of = {t.id: t.split for t in tasks}
    by_split = {"train": [t.id for t in tasks if t.split == "train"], "test": [t.id for t in tasks if t.split == "test"]}
    ev = spec.evaluation
    evaluated = evaluated_generations(ctx)
    verdicts = load_verdicts(store, f"{ctx.run}/eval/verdicts")
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
            win_share.append(WinShare(candidate=cand, baseline=base, split=split, **summary))

    agreement = []
    for h in sorted({int(v["judge"].removeprefix("gen-")) for v in own}):
        mine = [v for v in own if v["judge"] == f"gen-{h}"]
        agreement.append(Agreement(evaluator=h, **metrics.agreement(mine, panel)))

    audit, tokens, search, vetoes, training = [], [], [], [], []
    rollout_gens = sorted({int(k.split("/")[2].removeprefix("gen-")) for k in store.list(f"{ctx.run}/eval/")
                           if k.split("/")[2].startswith("gen-") and k.endswith("/audit.json")})
    for h in rollout_gens:
        keys = [k for k in store.list(f"{ctx.eval(h)}/") if k.endswith("/audit.json")]
        audits = [(k.split("/")[3], store.get_json(k)) for k in keys]
        for split in ("train", "test", "all"):
            chosen = [a for task, a in audits if split == "all" or split_of.get(task) == split]
            if chosen or split == "all":
                audit.append(Audit(generation=h, split=split, **metrics.audit_rates(chosen)))

    for g in range(spec.generations + 1):
        gen_eval = metrics.generated_tokens(_statuses(store, ctx.eval(g)))
        gen_search = metrics.generated_tokens(_statuses(store, f"{ctx.gen(g)}/search"))
        gen_collect = metrics.generated_tokens(_statuses(store, f"{ctx.gen(g)}/collect"))
        stats = _json_or_none(store, f"{ctx.sft(g)}/stats.json")
        log = _jsonl(store, f"{ctx.train(g)}/log.jsonl")
        chosen = selected_step(_json_or_none(store, ctx.select(g)))
        processed = metrics.processed_tokens([x for x in log if x.get("kind", "train") == "train"], chosen)
        if gen_eval or gen_search or gen_collect or stats or log:
            tokens.append(Tokens(
                generation=g, generated_search=gen_search, generated_collect=gen_collect, generated_eval=gen_eval,
                generated_total=gen_search + gen_collect + gen_eval, stored_supervised=stored_supervised(stats),
                processed_to_selected=processed["to_selected"], processed_to_end=processed["to_end"] if log else None))
        if log or chosen is not None:
            train_loss, val_loss = loss_curves(log)
            training.append(Training(generation=g, selected_step=chosen, train_loss=train_loss, val_loss=val_loss))

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
        run=ctx.run, generations=spec.generations, evaluated=evaluated, tasks=by_split, confidence=ev.confidence,
        intervals={"per_task": "wilson score interval",
                   "overall": f"percentile bootstrap over tasks, {ev.bootstrap} resamples, seed 0"},
        judges=[JudgeInfo(name=j.name, model=j.model, seeds=list(j.seeds)) for j in spec.judges],
        verdicts={"panel": count(panel), "self": count(own)},
        win_share=win_share, agreement=agreement, audit=audit, tokens=tokens, search=search,
        guard_vetoes=vetoes, training=training, invalid_verdicts=invalid, files=[],
    )
    return doc.model_dump(mode="json")


# ---------------------------------------------------------------- rendering


def _fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:.1f}%"
    return f"{x:,}" if isinstance(x, int) else f"{x:.4g}"


def _ci(ci) -> str:
    return "–" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def render_markdown(doc: dict) -> str:
    lines = [f"# MASS run `{doc['run']}`", "",
             f"Generations: {doc['generations']} (evaluated: {', '.join(f'L{g}' for g in doc['evaluated']) or 'none'}). "
             f"Train tasks: {', '.join(doc['tasks']['train']) or '–'}; test tasks: {', '.join(doc['tasks']['test']) or '–'}.",
             f"Judges: {', '.join(j['name'] + ' (' + j['model'] + ', seeds ' + str(j['seeds']) + ')' for j in doc['judges']) or 'none'}.",
             "", "## Win share (panel)", "",
             f"wins / (wins + losses), ties and invalid verdicts excluded. {int(100 * doc['confidence'])}% intervals: "
             f"per task {doc['intervals']['per_task']}; overall {doc['intervals']['overall']}.", "",
             "| comparison | split | wins | losses | ties | invalid | win share | CI |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for w in doc["win_share"]:
        lines.append(f"| L{w['candidate']} vs L{w['baseline']} | {w['split']} | {w['wins']} | {w['losses']} | {w['ties']} "
                     f"| {w['invalid']} | {_fmt(w['win_share'], True)} | {_ci(w['ci'])} |")
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
              "## Evaluator agreement with the panel majority", "", "| evaluator | agree | pairs | rate |",
              "|---|---:|---:|---:|"]
    for a in doc["agreement"]:
        lines.append(f"| L{a['evaluator']} | {a['agree']} | {a['pairs']} | {_fmt(a['rate'], True)} |")
    lines += ["", "## Behaviour audit (bare-prompt runs)", "",
              "| generation | split | episodes | delegation D | code handoff H |", "|---|---|---:|---:|---:|"]
    for a in doc["audit"]:
        lines.append(f"| L{a['generation']} | {a['split']} | {a['episodes']} | {a['delegation']}/{a['episodes']} "
                     f"| {a['code_handoff']}/{a['episodes']} |")
    lines += ["", "## Tokens", "", "| generation | generated (search / collect / eval) | stored supervised "
              "| processed to selected | processed to end |", "|---|---|---:|---:|---:|"]
    for t in doc["tokens"]:
        lines.append(f"| L{t['generation']} | {_fmt(t['generated_total'])} ({_fmt(t['generated_search'])} / "
                     f"{_fmt(t['generated_collect'])} / {_fmt(t['generated_eval'])}) | {_fmt(t['stored_supervised'])} "
                     f"| {_fmt(t['processed_to_selected'])} | {_fmt(t['processed_to_end'])} |")
    lines += ["", "## Workflow search", "", "| generation | tasks | elite beats reference after iteration k |",
              "|---|---:|---|"]
    for s in doc["search"]:
        lines.append(f"| L{s['generation']} | {s['tasks']} | {' '.join(map(str, s['coverage']))} |")
    lines += ["", "## Training", "", "| generation | selected step | last train loss | best val loss |",
              "|---|---:|---:|---:|"]
    for t in doc["training"]:
        last = t["train_loss"][-1][1] if t["train_loss"] else None
        best = min((x[1] for x in t["val_loss"]), default=None)
        lines.append(f"| L{t['generation']} | {_fmt(t['selected_step'])} | {_fmt(last)} | {_fmt(best)} |")
    lines += ["", f"## Guard vetoes ({len(doc['guard_vetoes'])})", ""]
    for x in doc["guard_vetoes"]:
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}: {'; '.join(x['reasons']) or 'vetoed'}")
    lines += ["", f"## Invalid panel verdicts ({len(doc['invalid_verdicts'])})", ""]
    for x in doc["invalid_verdicts"]:
        why = x["errors"][-1] if x["errors"] else "no reason recorded"
        lines.append(f"- L{x['candidate']} vs L{x['baseline']} {x['task']} rep {x['replicate']} {x['judge']} "
                     f"seed {x['seed']}: {why}")
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def render_plots(doc: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "mass"
    meta = {"Software": None}  # no version/date stamps: identical bytes on rebuild
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=100, metadata=meta)
        plt.close(fig)
        written.append(name)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for base_kind, marker in (("L0", "o"), ("prev", "s")):
        for split, color in (("train", "tab:blue"), ("test", "tab:orange")):
            pts = [w for w in doc["win_share"] if w["split"] == split and w["win_share"] is not None
                   and ((w["baseline"] == 0) == (base_kind == "L0"))]
            if not pts:
                continue
            xs = [w["candidate"] for w in pts]
            ys = [w["win_share"] for w in pts]
            err = [[y - (w["ci"] or [y, y])[0] for y, w in zip(ys, pts)], [(w["ci"] or [y, y])[1] - y
                                                                            for y, w in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, marker=marker, color=color, capsize=3, label=f"{split} vs {base_kind}")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    gens = doc.get("evaluated") or [1]
    ax.set(xlabel="generation", ylabel="win share", ylim=(0, 1), title="Win share by generation (panel)",
           xlim=(min(gens) - 0.5, max(gens) + 0.5))
    ax.set_xticks(gens, [f"L{g}" for g in gens])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:  # say why the plot is empty instead of showing bare axes
        p = doc["verdicts"]["panel"]
        ax.text(0.5, 0.7, f"no decisive panel verdict\n{p['total']} verdicts, {p['invalid']} invalid",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="dimgrey")
    save(fig, "win_share.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s in doc["search"]:
        ax.plot(range(len(s["coverage"])), s["coverage"], marker="o", label=f"L{s['generation']} ({s['tasks']} tasks)")
    ax.set(xlabel="iteration", ylabel="tasks whose elite\nbeats the reference", title="Workflow search")
    if doc["search"]:  # counts of tasks: integer axes from 0 to the number of tasks
        top = max(s["tasks"] for s in doc["search"])
        ax.set_yticks(range(top + 1))
        ax.set_ylim(-0.2, top + 0.2)
        ax.set_xticks(range(max(len(s["coverage"]) for s in doc["search"])))
        ax.legend(fontsize=8)
    save(fig, "search.png")

    n = max(1, len(doc["training"]))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.2), squeeze=False)
    for ax, t in zip(axes[0], doc["training"]):
        if t["train_loss"]:
            ax.plot(*zip(*t["train_loss"]), label="train")
        if t["val_loss"]:
            ax.plot(*zip(*t["val_loss"]), marker="o", label="validation")
        if t["selected_step"] is not None:
            ax.axvline(t["selected_step"], color="red", ls="--", label=f"selected {t['selected_step']}")
        ax.set(title=f"L{t['generation']} -> L{t['generation'] + 1}", xlabel="step", ylabel="loss")
        ax.legend(fontsize=7)
    save(fig, "loss.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    rows = [a for a in doc["audit"] if a["split"] == "all"]
    xs = [a["generation"] for a in rows]
    for shift, key, label in ((-0.2, "delegation", "delegation D"), (0.2, "code_handoff", "code handoff H")):
        bars = ax.bar([x + shift for x in xs], [a[f"{key}_rate"] or 0 for a in rows], width=0.4, label=label)
        # counts on the bars, so a 0 is visibly a measured 0 and not a missing bar
        ax.bar_label(bars, labels=[f"{a[key]}/{a['episodes']}" for a in rows], fontsize=8)
    ax.set(xlabel="generation", ylabel="share of bare-prompt episodes", ylim=(0, 1.1), title="Behaviour audit")
    ax.set_xticks(xs, [f"L{x}" for x in xs])
    ax.legend(fontsize=8)
    save(fig, "audit.png")

    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.4 * (len(doc["tokens"]) + 1)))
    ax.axis("off")
    cols = ["gen", "generated", "stored supervised", "processed (selected)", "processed (end)"]
    cells = [[f"L{t['generation']}", _fmt(t["generated_total"]), _fmt(t["stored_supervised"]),
              _fmt(t["processed_to_selected"]), _fmt(t["processed_to_end"])] for t in doc["tokens"]] or [["–"] * 5]
    table = ax.table(cellText=cells, colLabels=cols, loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(10)
    table.auto_set_column_width(list(range(len(cols))))
    table.scale(1, 1.4)
    ax.set_title("Tokens")
    save(fig, "tokens.png")
    return written


def write_report(ctx: RunContext) -> dict:
    """Build, validate and store `<run>/report/` (manifest last); returns report.json's content.

    Always rebuilt (it is cheap and its inputs are the whole store); the manifest's input hash is
    the report's own content, so two runs with equal stored results have equal manifests."""
    from mass_jobs.store import Step

    doc = build_report(ctx)
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
            ctx.store.put_file(f"{ctx.report()}/{name}", out / name)
        step.finish([f"{ctx.report()}/{name}" for name in files])
    return doc
