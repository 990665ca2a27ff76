"""Workflow information proxies: how much the searched workflows' text tells about their results.

    mass report --spec S     (report.json `information`, report.md "Workflow information", information.png)

Per generation, one sample per search rollout that had a workflow (iteration k of a training task):
  E        the workflow's prompt text embedded locally (`mass_jobs.judging.embed`), reduced to its
           leading principal components (at most DIMS, fewer when samples are few);
  outcome  1 when the episode ended in `success`, else 0;
  verdict  1 when the rollout won its comparison (k >= 1: over the elite it challenged; k = 0: the
           initial workflow over the bare reference run), else 0 (a loss, a tie or an invalid verdict).
Reported in nats: I(E; outcome), I(E; verdict) and the total correlation TC(E, outcome, verdict)
(sum of the block entropies minus the joint entropy), each computed from the sample covariance AS IF
the variables were jointly Gaussian. They are exact for Gaussian data only; outcome and verdict are
binary, so these are PROXIES of dependence, not measured information, and with few samples they are
biased upwards (about (d1*d2)/(2n) nats for an MI of d1 and d2 dimensions). The `_within` variants
subtract each task's mean from every variable first (task-mean removal), so that differences between
tasks (wording and difficulty both differ by task) do not count as dependence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import Field

from mass_jobs.config.shared import Closed
from mass_jobs.judging.embed import make_embedder
from mass_jobs.spec.workflow_docs import text_of

DIMS = 4  # principal components of the embedding kept at most
RIDGE = 1e-9  # added to the correlation matrix's diagonal: logdet of a rank-deficient sample stays finite


# ---------------------------------------------------------------- estimators (pure)


def gaussian_tc_from_cov(cov: np.ndarray, blocks: Sequence[Sequence[int]]) -> float:
    """Closed form for jointly Gaussian variables: 0.5 * (sum_b logdet cov[b, b] - logdet cov[blocks])."""
    cov = np.asarray(cov, dtype=float)
    idx = [i for b in blocks for i in b]
    _, joint = np.linalg.slogdet(cov[np.ix_(idx, idx)])
    parts = sum(np.linalg.slogdet(cov[np.ix_(list(b), list(b))])[1] for b in blocks)
    return float(0.5 * (parts - joint))


def gaussian_tc(x: np.ndarray, blocks: Sequence[Sequence[int]] | None = None) -> float:
    """Gaussian total-correlation estimate (nats) of the columns of samples `x` (n, p), grouped into
    `blocks` (column indices; default one block per column). Two blocks give the Gaussian MI."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or x.shape[0] < 3:
        raise ValueError(f"need samples as an (n >= 3, p) array, got shape {x.shape}")
    blocks = [[i] for i in range(x.shape[1])] if blocks is None else [list(b) for b in blocks]
    sd = x.std(axis=0, ddof=1)
    if np.any(sd == 0):
        raise ValueError(f"columns {np.flatnonzero(sd == 0).tolist()} are constant: their entropy is undefined")
    corr = np.corrcoef(x, rowvar=False).reshape(x.shape[1], x.shape[1])  # TC is scale-free; this conditions it
    return gaussian_tc_from_cov(corr + RIDGE * np.eye(len(corr)), blocks)


def gaussian_mi(x: np.ndarray, y: np.ndarray) -> float:
    """Gaussian MI estimate (nats) between sample blocks x (n, dx) and y (n, dy)."""
    x, y = np.atleast_2d(np.asarray(x, float).T).T, np.atleast_2d(np.asarray(y, float).T).T
    dx = x.shape[1]
    return gaussian_tc(np.hstack([x, y]), [range(dx), range(dx, dx + y.shape[1])])


def remove_group_means(x: np.ndarray, groups: Sequence) -> np.ndarray:
    """Each row minus the mean of the rows of its group (task-mean removal)."""
    x = np.asarray(x, dtype=float).copy()
    labels = np.asarray(groups)
    for g in dict.fromkeys(groups):
        rows = labels == g
        x[rows] -= x[rows].mean(axis=0)
    return x


def principal_components(e: np.ndarray, k: int) -> np.ndarray:
    """Scores of the k leading principal components of the (already centred) rows of e."""
    u, s, _ = np.linalg.svd(e, full_matrices=False)
    return u[:, :k] * s[:k]


# ---------------------------------------------------------------- the analysis of one generation


class InformationProxy(Closed):
    """Gaussian proxies (nats) between workflow embeddings and search results of one generation."""

    generation: int
    embedder: str = Field(description="Local text embedder of the workflow text.")
    samples: int = Field(description="Search rollouts with a workflow (all training tasks).")
    tasks: int
    success_rate: float | None
    win_rate: float | None = Field(description="Share of rollouts that won their comparison.")
    dims: int | None = Field(description="Principal components of the embedding used; null: too few samples.")
    mi_outcome: float | None = Field(description="Gaussian proxy of I(E; outcome); null when undefined.")
    mi_verdict: float | None = Field(description="Gaussian proxy of I(E; verdict).")
    tc: float | None = Field(description="Gaussian proxy of TC(E, outcome, verdict).")
    dims_within: int | None = Field(description="Components used after task-mean removal.")
    mi_outcome_within: float | None
    mi_verdict_within: float | None
    tc_within: float | None = Field(description="Task-mean-removed TC proxy.")


def _proxies(e: np.ndarray, outcome: np.ndarray, verdict: np.ndarray, dof: int) -> dict:
    """dims, mi_outcome, mi_verdict, tc of centred embeddings and scalars with `dof` degrees of freedom."""
    rank = int(np.linalg.matrix_rank(e)) if e.size else 0
    d = min(DIMS, rank, max(0, (dof - 2) // 2))  # leave samples to spare: a covariance of d + 2 variables
    none = {"dims": None, "mi_outcome": None, "mi_verdict": None, "tc": None}
    if d < 1:
        return none
    pcs = principal_components(e, d)
    scalars = {name: v for name, v in (("outcome", outcome), ("verdict", verdict)) if np.ptp(v) > 1e-12}
    out = {"dims": d, "mi_outcome": None, "mi_verdict": None, "tc": None}
    for name, v in scalars.items():
        out[f"mi_{name}"] = round(gaussian_mi(pcs, v), 6)
    if scalars:
        cols = np.column_stack([pcs, *scalars.values()])
        out["tc"] = round(gaussian_tc(cols, [range(d), *[[d + i] for i in range(len(scalars))]]), 6)
    return out


def analyse(generation: int, samples: list[dict], embedder) -> InformationProxy:
    """samples: [{"task", "text", "outcome": 0|1, "verdict": 0|1}, ...] of one generation."""
    n, tasks = len(samples), [s["task"] for s in samples]
    base = {
        "generation": generation,
        "embedder": embedder.name,
        "samples": n,
        "tasks": len(set(tasks)),
        "success_rate": None,
        "win_rate": None,
    }
    empty = {k: None for k in ("dims", "mi_outcome", "mi_verdict", "tc")}
    if n < 3:
        return InformationProxy(**base, **empty, **{f"{k}_within": v for k, v in empty.items()})
    emb = embedder.embed([s["text"] for s in samples])
    outcome = np.array([float(s["outcome"]) for s in samples])
    verdict = np.array([float(s["verdict"]) for s in samples])
    base.update(success_rate=round(float(outcome.mean()), 6), win_rate=round(float(verdict.mean()), 6))
    raw = _proxies(emb - emb.mean(axis=0), outcome, verdict, dof=n - 1)
    within = _proxies(
        remove_group_means(emb, tasks),
        remove_group_means(outcome[:, None], tasks)[:, 0],
        remove_group_means(verdict[:, None], tasks)[:, 0],
        dof=n - len(set(tasks)),
    )
    return InformationProxy(**base, **raw, **{f"{k}_within": v for k, v in within.items()})


def search_samples(states: dict[str, dict]) -> list[dict]:
    """One sample per rollout with a workflow, from the search states of one generation (task -> state)."""

    out = []
    for task, state in sorted(states.items()):
        for rec in state.get("iterations", []):
            if rec.get("workflow") is None or rec.get("outcome") is None:
                continue  # a failed proposal: nothing was rolled out
            k = rec["k"]
            # the verdict that judged it: against the reference (iteration 0, selection champion), else the elite
            champion = k == 0 or state.get("selection", "champion") == "champion"
            versus = rec.get("reference_verdict") if champion else rec.get("verdict")
            won = bool(versus and versus.get("valid") and versus.get("winner") == f"iter-{k}")
            out.append(
                {
                    "task": task,
                    "k": k,
                    "text": text_of(rec["workflow"]),
                    "outcome": int(rec["outcome"] == "success"),
                    "verdict": int(won),
                }
            )
    return out


def workflow_information(ctx, embedder=None) -> list[InformationProxy]:
    """Per generation with stored search states, the proxies over its training tasks' rollouts."""

    embedder = embedder or make_embedder(ctx.spec.evaluation.embedder)  # the spec's: mass status rebuilds the same
    rows = []
    train = [t.id for t in ctx.spec.train_tasks()]
    for g in range(ctx.spec.generations + 1):
        keys = {t: ctx.search_state(g, t) for t in train}
        states = {t: ctx.store.get_json(k) for t, k in keys.items() if ctx.store.exists(k)}
        if states:
            rows.append(analyse(g, search_samples(states), embedder))
    return rows


def plot_information(rows: list[dict], ax) -> None:
    """Grouped bars per generation: each proxy raw and task-mean-removed (hatched)."""
    names = [("mi_outcome", "I(E; outcome)"), ("mi_verdict", "I(E; verdict)"), ("tc", "TC(E, outcome, verdict)")]
    width = 0.8 / (2 * len(names))
    for i, (key, label) in enumerate(names):
        for j, (suffix, style) in enumerate((("", {}), ("_within", {"hatch": "//", "alpha": 0.6}))):
            xs = [r["generation"] - 0.4 + width * (2 * i + j + 0.5) for r in rows]
            ys = [r[key + suffix] or 0.0 for r in rows]
            ax.bar(xs, ys, width=width, color=f"C{i}", label=label + (" task-mean-removed" if suffix else ""), **style)
    ax.set_xticks([r["generation"] for r in rows], [f"L{r['generation']} (n={r['samples']})" for r in rows])
    ax.set(ylabel="nats (Gaussian proxy)", title="Workflow information (Gaussian proxies, not exact MI/TC)")
    if rows:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no search states", transform=ax.transAxes, ha="center", color="dimgrey")
