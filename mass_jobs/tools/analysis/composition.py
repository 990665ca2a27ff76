"""Runs side by side: teacher composition, training windows by role, token accounting, win share.

    mass compare-runs SPEC_A SPEC_B [...] --out DIR      (writes DIR/compare.{json,md})

For the paper's composition controls (a team teacher vs a single-agent teacher, other role shares,
a stronger optimizer or evaluator): runs that differ only in those settings are read from their
stores (each through `mass_jobs.steps.report.build_report`, so the numbers are the reports' own) and
put in one table per quantity: what each run's teacher and preset were (windows, shares, checkpoint
selection; mass_jobs.config.composition), how many training windows each role got, the selected checkpoint
and by what, the three token quantities (generated, stored supervised, processed supervised to the
selected checkpoint and to the end) per generation and for the run, and the panel win share of each
generation against L0.
"""

from __future__ import annotations

from mass_jobs.config.composition import composition_of
from mass_jobs.serving.roles import ROLES, role_label
from mass_jobs.steps.report import build_report

SELECTION = {"val_loss": "validation loss", "panel": "judge panel"}
TOKEN_KEYS = ("generated_total", "stored_supervised", "processed_to_selected", "processed_to_end")
TOKEN_LABELS = ("generated", "stored supervised", "processed to selected", "processed to end")


def composition(spec) -> dict:
    """The settings that make up a run's teacher and student data (what a composition comparison
    varies): the teacher, the preset's windows, shares and checkpoint selection, the role models."""

    comp = composition_of(spec.sft)
    return {
        "preset": comp.preset or "–",
        "teacher": spec.collection.teacher,
        "harness": spec.execution.harness,
        "window_roles": ", ".join(comp.roles),
        "training_episodes": comp.episodes,
        "orchestrator_share": round(comp.orchestrator_share, 6),
        "episodes": spec.collection.episodes,
        "train_ranks": spec.collection.train_ranks,
        "checkpoint_selection": SELECTION[comp.checkpoint],
        "roles": {r: role_label(spec, r, 0).replace("gen-0", "current generation") for r in ROLES},
    }


def run_summary(ctx) -> dict:
    """One run's column: composition, windows by role, tokens and win share per generation."""
    doc = build_report(ctx)
    windows = {}
    for g in range(ctx.spec.generations + 1):
        key = ctx.sft_file(g, "stats")
        if ctx.store.exists(key):
            train = ctx.store.get_json(key).get("train") or {}
            windows[str(g)] = dict(train.get("windows_by_role") or {})
    win = {str(w["candidate"]): w["win_share"] for w in doc["win_share"] if w["baseline"] == 0 and w["split"] == "all"}
    selected = {}
    for g in range(ctx.spec.generations + 1):
        if ctx.store.exists(ctx.select(g)):
            chosen = ctx.store.get_json(ctx.select(g))
            selected[str(g)] = f"{chosen.get('step')} ({SELECTION.get(chosen.get('by', 'val_loss'), '?')})"
    tokens = {str(t["generation"]): {k: t[k] for k in TOKEN_KEYS} for t in doc["tokens"]}
    # the run's total of each quantity (None when no generation has it)
    total = {
        k: (
            sum(v[k] for v in tokens.values() if v[k] is not None)
            if any(v[k] is not None for v in tokens.values())
            else None
        )
        for k in TOKEN_KEYS
    }
    return {
        "run": ctx.run,
        "composition": composition(ctx.spec),
        "windows_by_role": windows,
        "selected": selected,
        "tokens": tokens,
        "tokens_total": total,
        "win_share_vs_l0": win,
    }


def compare_runs(contexts: list) -> dict:
    return {"runs": [run_summary(c) for c in contexts]}


def render_comparison(doc: dict) -> str:
    runs = doc["runs"]

    def fmt(x) -> str:
        if x is None:
            return "–"
        return f"{x:,}" if isinstance(x, int) else f"{100 * x:.1f}%" if isinstance(x, float) else str(x)

    head = "| | " + " | ".join(f"`{r['run']}`" for r in runs) + " |"
    rule = "|---|" + "---|" * len(runs)
    lines = ["# Runs side by side", "", "## Composition", "", head, rule]
    for key in (
        "preset",
        "teacher",
        "harness",
        "window_roles",
        "training_episodes",
        "episodes",
        "train_ranks",
        "checkpoint_selection",
    ):
        lines.append(f"| {key} | " + " | ".join(str(r["composition"][key]) for r in runs) + " |")
    lines.append(
        "| orchestrator share | " + " | ".join(f"{r['composition']['orchestrator_share']:.3f}" for r in runs) + " |"
    )
    for role in ("optimizer", "evaluator", "executor"):
        lines.append(f"| {role} | " + " | ".join(r["composition"]["roles"][role] for r in runs) + " |")
    gens = sorted({g for r in runs for g in (*r["tokens"], *r["windows_by_role"])}, key=int)
    lines += ["", "## Training windows by role (train split)", "", head, rule]
    for g in gens:
        for role in ("orchestrator", "worker", "auxiliary"):
            lines.append(
                f"| L{g} {role} | "
                + " | ".join(fmt((r["windows_by_role"].get(g) or {}).get(role)) for r in runs)
                + " |"
            )
    lines += ["", "## Selected checkpoints", "", head, rule]
    for g in sorted({g for r in runs for g in r["selected"]}, key=int):
        lines.append(f"| L{g} step | " + " | ".join(r["selected"].get(g, "–") for r in runs) + " |")
    lines += ["", "## Tokens", "", head, rule]
    for g in gens:
        for key, label in zip(TOKEN_KEYS, TOKEN_LABELS):
            lines.append(
                f"| L{g} {label} | " + " | ".join(fmt((r["tokens"].get(g) or {}).get(key)) for r in runs) + " |"
            )
    for key, label in zip(TOKEN_KEYS, TOKEN_LABELS):
        lines.append(f"| run {label} | " + " | ".join(fmt(r["tokens_total"][key]) for r in runs) + " |")
    cands = sorted({g for r in runs for g in r["win_share_vs_l0"]}, key=int)
    lines += ["", "## Win share against L0 (panel, all tasks)", "", head, rule]
    for g in cands:
        lines.append(f"| L{g} | " + " | ".join(fmt(r["win_share_vs_l0"].get(g)) for r in runs) + " |")
    return "\n".join(lines) + "\n"
