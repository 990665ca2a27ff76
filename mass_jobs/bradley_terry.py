"""Bradley–Terry scores from pairwise verdicts (ties count as half a win to each side).

A weak prior keeps every score finite: each item plays a virtual tie of weight `prior` against a
fixed reference player of strength 1 (log-score 0). Because Bradley–Terry is scale invariant, this
is exactly the maximum-likelihood fit of the augmented data with the reference player's score
pinned at 0, which is how the tests compare it with an independent implementation.
Fitted by the minorization–maximization updates of Hunter (2004).

Used by `mass rank`; no command of its own.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence


def fit(
    items: Sequence[Hashable],
    outcomes: Iterable[tuple[Hashable, Hashable, float]],
    prior: float = 0.1,
    tol: float = 1e-12,
    max_iter: int = 100000,
) -> dict[Hashable, float]:
    """Log-strength per item. outcomes: (a, b, score of a) with score 1 win, 0.5 tie, 0 loss."""
    if prior <= 0:
        raise ValueError(f"prior must be > 0 so undefeated items stay finite, got {prior}")
    index = {x: i for i, x in enumerate(items)}
    if len(index) != len(items):
        raise ValueError("items must be unique")
    n = len(items)
    ref = n  # the virtual reference player
    wins = [prior / 2] * n + [prior * n / 2]
    games: dict[tuple[int, int], float] = {}
    for i in range(n):
        games[(i, ref)] = prior
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
    neighbours: list[list[tuple[int, float]]] = [[] for _ in range(n + 1)]
    for (i, j), c in games.items():
        neighbours[i].append((j, c))
        neighbours[j].append((i, c))
    p = [1.0] * (n + 1)
    for _ in range(max_iter):
        new = []
        for i in range(n + 1):
            denom = sum(c / (p[i] + p[j]) for j, c in neighbours[i])
            new.append(wins[i] / denom)
        scale = new[ref]
        new = [x / scale for x in new]
        delta = max(abs(math.log(x) - math.log(y)) for x, y in zip(new, p))
        p = new
        if delta < tol:
            break
    return {x: math.log(p[index[x]]) for x in items}


def ranking(scores: dict[Hashable, float], ndigits: int = 9) -> list[Hashable]:
    """Items best first; equal scores (to `ndigits`) ordered by item id so the order is deterministic."""
    return sorted(scores, key=lambda x: (-round(scores[x], ndigits), str(x)))
