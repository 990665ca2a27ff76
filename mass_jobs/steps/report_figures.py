"""The report's figures (PNG beside report.json): win share per comparison with its interval, the
search's progress, training and validation loss, the behaviour audit, tokens and information."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mass_jobs.judging.information import plot_information
from mass_jobs.steps.report_render import fmt


def _series(ax, doc: dict, i: int, base_kind: str, split: str) -> None:
    """One series of the win-share figure: its points, their intervals and counts."""
    marker, color = {"L0": "o", "prev": "s"}[base_kind], {"train": "tab:blue", "test": "tab:orange"}[split]
    pts = [
        w
        for w in doc["win_share"]
        if w["split"] == split and w["win_share"] is not None and ((w["baseline"] == 0) == (base_kind == "L0"))
    ]
    if not pts:
        return
    dx = (i - 1.5) * 0.14  # side by side, so series at one generation do not hide each other
    xs = [w["candidate"] + dx for w in pts]
    ys = [w["win_share"] for w in pts]
    err = [
        [y - (w["ci"] or [y, y])[0] for y, w in zip(ys, pts)],
        [(w["ci"] or [y, y])[1] - y for y, w in zip(ys, pts)],
    ]
    ax.errorbar(xs, ys, yerr=err, marker="none", color=color, capsize=3, ls="none")
    # hollow per point: a judge biased at one generation says nothing of the others
    ax.scatter(
        xs,
        ys,
        marker=marker,
        s=36,
        zorder=3,
        edgecolors=color,
        label=f"{split} vs {base_kind}",
        facecolors=["white" if w["note"] else color for w in pts],
    )
    for x, y, w in zip(xs, ys, pts):  # n to the right: clear of the vertical error bars
        ax.annotate(
            f"n={w['wins'] + w['losses']}",
            (x, y),
            textcoords="offset points",
            xytext=(5, 0),
            ha="left",
            va="center",
            fontsize=7,
            color=color,
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"},
        )  # readable on the 50% line


def win_share_figure(doc: dict):
    """(figure, axes) of the panel's win share per generation, series by split and baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    series = [(b, s) for b in ("L0", "prev") for s in ("train", "test")]
    for i, (base_kind, split) in enumerate(series):
        _series(ax, doc, i, base_kind, split)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    gens = doc.get("evaluated") or [1]
    p = doc["verdicts"]["panel"]
    ax.set(
        xlabel="generation",
        ylabel="win share (wins / decisive)",
        ylim=(-0.05, 1.05),
        title=f"Win share by generation (panel, {p['valid']} valid of {p['total']} verdicts;\n"
        "n = decisive verdicts per point, hollow = position-biased judge)",
        xlim=(min(gens) - 0.5, max(gens) + 0.5),
    )
    ax.title.set_fontsize(9)
    ax.set_xticks(gens, [f"L{g}" for g in gens])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    else:  # say why the plot is empty instead of showing bare axes
        ax.text(
            0.5,
            0.7,
            f"no decisive panel verdict\n{p['total']} verdicts, {p['invalid']} invalid",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=10,
            color="dimgrey",
        )
    return fig, ax


def figures(doc: dict) -> list[tuple[str, Any]]:
    """The report's plots as (file name, matplotlib figure), each saying its n in its texts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = [("win_share.png", win_share_figure(doc)[0])]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s in doc["search"]:
        ax.plot(
            range(len(s["coverage"])), s["coverage"], marker="o", label=f"L{s['generation']} (n={s['tasks']} tasks)"
        )
    tasks = max((s["tasks"] for s in doc["search"]), default=0)
    ax.set(
        xlabel="iteration",
        ylabel="tasks whose elite\nbeats the reference",
        title=f"Workflow search (n = {tasks} train tasks per generation)",
    )
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
        ax.set(
            title=f"L{t['generation']} -> L{t['generation'] + 1}\nn = {len(t['train_loss'])} steps, "
            f"{len(t['val_loss'])} val points" + (f", {tok:,} tokens" if tok else ""),
            xlabel="step",
            ylabel="loss",
        )
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
    ax.set(
        xlabel="generation (n = bare-prompt episodes)",
        ylabel="share of bare-prompt episodes",
        ylim=(0, 1.15),
        title="Behaviour audit (bars: count / n)",
    )
    ax.set_xticks(xs, [f"L{a['generation']}\nn={a['episodes']}" for a in rows])
    ax.legend(fontsize=8, loc="upper right")
    figs.append(("audit.png", fig))

    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.4 * (len(doc["tokens"]) + 1)))
    ax.axis("off")
    cols = ["gen", "n episodes", "generated", "stored supervised", "processed (selected)", "processed (end)"]
    cells = [
        [
            f"L{t['generation']}",
            str(t["generated_episodes"]),
            fmt(t["generated_total"]),
            fmt(t["stored_supervised"]),
            fmt(t["processed_to_selected"]),
            fmt(t["processed_to_end"]),
        ]
        for t in doc["tokens"]
    ] or [["–"] * len(cols)]
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
