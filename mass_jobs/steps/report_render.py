"""The run report rendered for people: report.md (opening with how to read it) and its plots,
each showing its n, from the report document alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mass_jobs.episodes.harness import CAPS, OUTCOMES
from mass_jobs.judging.information import plot_information

PLOTS = ("win_share.png", "search.png", "loss.png", "audit.png", "tokens.png", "information.png")
# What each plot shows, in the words a finished run prints beside its path.
CAPTIONS = {"win_share.png": "the panel's win share per generation, with 95% intervals",
            "search.png": "workflow search: tasks whose elite beats the reference, per iteration",
            "loss.png": "training and validation loss per generation",
            "audit.png": "delegation and code handoff per generation",
            "tokens.png": "tokens per episode by role",
            "information.png": "what the panel's verdicts can tell apart"}


def win_share_summary(doc: dict) -> str:
    """The win-share plot in one line: each comparison of all tasks with its interval and n."""
    parts = []
    for w in doc.get("win_share") or []:
        if w.get("split") != "all" or w.get("win_share") is None:
            continue
        lo, hi = w.get("ci") or (None, None)
        ci = f" [{lo:.0%}, {hi:.0%}]" if lo is not None else ""
        bias = " (position-biased)" if w.get("note") else ""
        parts.append(f"L{w['candidate']} vs L{w['baseline']} {w['win_share']:.0%}{ci}, n={w['wins'] + w['losses']}{bias}")
    return "; ".join(parts) or "no decisive panel verdict"


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
    """report.md: its sections in order, then the plots."""
    sections = (_head_and_win_share, _verdicts_and_agreement, _audit_and_tokens, _outcomes, _data_search_training,
                _left_out, _composition_roles_information)
    lines = [line for section in sections for line in section(doc)]
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def _head_and_win_share(doc: dict) -> list[str]:
    """The title, warnings, how to read it, and the panel's win share per comparison and task."""
    warnings = doc.get("warnings") or []
    lines = [f"# MASS run `{doc['run']}`", "",
             *(["## Warnings", "", *[f"- **{w}**" for w in warnings], ""] if warnings else []),
             "## How to read this", "",
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
    return lines


def _verdicts_and_agreement(doc: dict) -> list[str]:
    """Verdict counts and the self-evaluator's agreement with the panel majority."""
    lines: list[str] = []
    v = doc["verdicts"]
    lines += ["", f"Verdicts: panel {v['panel']['total']} ({v['panel']['invalid']} invalid), "
              f"self-evaluator {v['self']['total']} ({v['self']['invalid']} invalid), ranking "
              f"{v.get('rank', {}).get('total', 0)} ({v.get('rank', {}).get('invalid', 0)} invalid: left out of the "
              "Bradley-Terry fit).", "",
              "## Evaluator agreement with the panel majority", "",
              "A pair counts when the self-evaluator gave a valid verdict and more than half of the panel's valid "
              "verdicts made the same call; a split panel is 'no majority', neither agreement nor disagreement.", "",
              "| evaluator | agree | pairs with a majority | no majority | rate |", "|---|---:|---:|---:|---:|"]
    for a in doc["agreement"]:
        rate = _fmt(a["rate"], True) if a["pairs"] else f"no majority: {a['no_majority']}" if a["no_majority"] else "–"
        lines.append(f"| L{a['evaluator']} | {a['agree']} | {a['pairs']} | {a['no_majority']} | {rate} |")
    return lines


def _audit_and_tokens(doc: dict) -> list[str]:
    """The behaviour audit of bare-prompt runs and the token accounting."""
    lines: list[str] = []
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
    return lines


def _outcomes(doc: dict) -> list[str]:
    """Episode outcomes, caps reached and the shell commands' network."""
    lines: list[str] = []
    if doc.get("outcomes"):
        names = [o for o in OUTCOMES if any(x["by_outcome"].get(o) for x in doc["outcomes"])] or ["success"]
        lines += ["", "## Episode outcomes", "",
                  "no_work: finished without a workspace tool call (not ranked or trained on unless "
                  "`collection.keep_no_work`).", "",
                  "| generation | stage | episodes | tool calls / episode | " + " | ".join(names) + " |",
                  "|---|---|---:|---:|" + "---:|" * len(names)]
        for x in doc["outcomes"]:
            lines.append(f"| L{x['generation']} | {x['stage']} | {x['episodes']} | {_fmt(x.get('tool_calls_per_episode'))} | "
                         + " | ".join(str(x["by_outcome"].get(o, 0)) for o in names) + " |")
        lines += ["", "Episodes ended by a cap of `execution.limits`:", "",
                  "| generation | stage | " + " | ".join(CAPS) + " |", "|---|---|" + "---:|" * len(CAPS)]
        lines += [f"| L{x['generation']} | {x['stage']} | " + " | ".join(str(x.get("by_cap", {}).get(c, 0)) for c in CAPS)
                  + " |" for x in doc["outcomes"]]
        online = [x for x in doc["outcomes"] if x.get("network")]
        if online:
            lines += ["", "Network of the shell commands (`execution.network`, every request in the episode's "
                      "`network.jsonl`):", "",
                      "| generation | stage | episodes | requests | allowed | denied | bytes in | hosts |",
                      "|---|---|---:|---:|---:|---:|---:|---|"]
            lines += [f"| L{x['generation']} | {x['stage']} | {n['episodes']} | {n['requests']} | {n['allowed']} "
                      f"| {n['denied']} | {n['bytes_down']} | {', '.join(n['hosts'][:8]) or '-'} |"
                      for x in online for n in [x["network"]]]
    return lines


def _data_search_training(doc: dict) -> list[str]:
    """SFT data, workflow search coverage and training."""
    lines: list[str] = []
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
    return lines


def _left_out(doc: dict) -> list[str]:
    """Guard vetoes, episodes flagged for review and invalid panel verdicts."""
    lines: list[str] = []
    lines += ["", f"## Guard vetoes ({len(doc['guard_vetoes'])})", ""]
    if doc.get("guard_counts"):
        lines += ["| generation | guard | episodes left out |", "|---|---|---:|"]
        lines += [f"| L{c['generation']} | {c['guard']} | {c['episodes']} |" for c in doc["guard_counts"]] + [""]
    for x in doc["guard_vetoes"]:
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}: {'; '.join(x['reasons']) or 'vetoed'}")
    lines += ["", f"## Flagged for review ({len(doc.get('review', []))})", "",
              "Claims of a deliverable that no guard can verify (a number its metrics file contradicts); such "
              "an episode is not ranked or trained on unless its task's guards.train_flagged says so.", ""]
    for x in doc.get("review", []):
        fate = (" (vetoed)" if x["vetoed"] else " (not trained)" if x.get("held")
                else " (trained: guards.train_flagged)" if x.get("trained") else "")
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}{fate}: {'; '.join(x['claims'])}")
    lines += ["", f"## Invalid panel verdicts ({len(doc['invalid_verdicts'])})", ""]
    for x in doc["invalid_verdicts"]:
        why = x["errors"][-1] if x["errors"] else "no reason recorded"
        lines.append(f"- L{x['candidate']} vs L{x['baseline']} {x['task']} rep {x['replicate']} {x['judge']} "
                     f"seed {x['seed']}: {why}")
    return lines


def _composition_roles_information(doc: dict) -> list[str]:
    """The teacher's composition, the roles and the workflow information."""
    lines: list[str] = []
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
    return lines


def win_share_figure(doc: dict):
    """(figure, axes) of the panel's win share per generation, series by split and baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.errorbar(xs, ys, yerr=err, marker="none", color=color, capsize=3, ls="none")
        # hollow per point: a judge biased at one generation says nothing of the others
        ax.scatter(xs, ys, marker=marker, s=36, zorder=3, edgecolors=color, label=f"{split} vs {base_kind}",
                   facecolors=["white" if w["note"] else color for w in pts])
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
    return fig, ax


def figures(doc: dict) -> list[tuple[str, Any]]:
    """The report's plots as (file name, matplotlib figure), each saying its n in its texts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = [("win_share.png", win_share_figure(doc)[0])]

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
