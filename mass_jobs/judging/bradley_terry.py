"""Bradley–Terry scores from pairwise verdicts (ties count as half a win to each side).

Two estimators, both fitted by the minorization–maximization (MM) updates of Hunter (2004); they
differ only in the weak prior that keeps an undefeated episode's score finite:

- `virtual_wins` (default; the paper's public code, `mass/ranking.py` of SakanaAI/mass): every
  item gets `prior` (0.5) virtual wins in `prior` virtual games against a pseudo-opponent of fixed
  strength 1, and the strengths are rescaled to mean 1 after every MM sweep. The pseudo-opponent
  never wins, so the likelihood has no maximum; the estimate is the fixed point of the rescaled
  MM map: W_i = c * p_i * (prior / (p_i + 1) + sum_j n_ij / (p_i + p_j)) for one c > 0 and all i,
  with mean(p) = 1. Upstream stops after 500 sweeps; here the sweeps run to that fixed point.
- `virtual_ties`: every item plays a virtual tie of weight `prior` (0.1) against a reference
  player pinned at strength 1 (log-score 0). This is the maximum-likelihood fit of the augmented
  data, so the tests compare it with choix.

Used by `mass rank`; no command of its own.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

ESTIMATORS = ("virtual_wins", "virtual_ties")
DEFAULT_PRIOR = {"virtual_wins": 0.5, "virtual_ties": 0.1}


def _tally(items: Sequence[Hashable], outcomes: Iterable[tuple[Hashable, Hashable, float]]):
    """(index, real wins per item, games per unordered index pair), with the inputs checked."""
    index = {x: i for i, x in enumerate(items)}
    if len(index) != len(items):
        raise ValueError("items must be unique")
    wins = [0.0] * len(items)
    games: dict[tuple[int, int], float] = {}
    for a, b, s in outcomes:
        if a not in index or b not in index:
            raise KeyError(f"outcome ({a!r}, {b!r}) names an unknown item")
        if not 0 <= s <= 1:
            raise ValueError(f"outcome score must be in [0, 1], got {s}")
        i, j = index[a], index[b]
        if i == j:
            raise ValueError(f"an item cannot be compared with itself: {a!r}")
        wins[i] += s
        wins[j] += 1 - s
        key = (min(i, j), max(i, j))
        games[key] = games.get(key, 0.0) + 1.0
    return index, wins, games


def _neighbours(size: int, games: dict[tuple[int, int], float]) -> list[list[tuple[int, float]]]:
    out: list[list[tuple[int, float]]] = [[] for _ in range(size)]
    for (i, j), c in games.items():
        out[i].append((j, c))
        out[j].append((i, c))
    return out


def fit(
    items: Sequence[Hashable],
    outcomes: Iterable[tuple[Hashable, Hashable, float]],
    estimator: str = "virtual_wins",
    prior: float | None = None,
    tol: float = 1e-12,
    max_iter: int = 100000,
) -> dict[Hashable, float]:
    """Log-strength per item. outcomes: (a, b, score of a) with score 1 win, 0.5 tie, 0 loss.

    prior: the estimator's virtual weight; None takes its default (DEFAULT_PRIOR)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    prior = DEFAULT_PRIOR[estimator] if prior is None else prior
    if prior <= 0:
        raise ValueError(f"prior must be > 0 so undefeated items stay finite, got {prior}")
    index, wins, games = _tally(items, outcomes)
    solve = _virtual_wins if estimator == "virtual_wins" else _virtual_ties
    p = solve(len(items), wins, games, prior, tol, max_iter)
    return {x: math.log(p[index[x]]) for x in items}


def _virtual_wins(n, wins, games, prior, tol, max_iter) -> list[float]:
    if n == 0:
        return []
    w = [x + prior for x in wins]
    nb = _neighbours(n, games)
    p = [1.0] * n
    for _ in range(max_iter):
        new = [w[i] / (prior / (p[i] + 1.0) + sum(c / (p[i] + p[j]) for j, c in nb[i])) for i in range(n)]
        mean = sum(new) / n
        new = [x / mean for x in new]
        delta = max(abs(math.log(x) - math.log(y)) for x, y in zip(new, p))
        p = new
        if delta < tol:
            break
    return p


def _virtual_ties(n, wins, games, prior, tol, max_iter) -> list[float]:
    ref = n  # the virtual reference player, pinned at strength 1
    w = [x + prior / 2 for x in wins] + [prior * n / 2]
    games = dict(games) | {(i, ref): prior for i in range(n)}
    nb = _neighbours(n + 1, games)
    p = [1.0] * (n + 1)
    for _ in range(max_iter):
        new = [w[i] / sum(c / (p[i] + p[j]) for j, c in nb[i]) for i in range(n + 1)]
        new = [x / new[ref] for x in new]
        delta = max(abs(math.log(x) - math.log(y)) for x, y in zip(new, p))
        p = new
        if delta < tol:
            break
    return p[:n]


def ranking(scores: dict[Hashable, float], ndigits: int = 9) -> list[Hashable]:
    """Items best first; equal scores (to `ndigits`) ordered by item id so the order is deterministic."""
    return sorted(scores, key=lambda x: (-round(scores[x], ndigits), str(x)))
