"""Connected pairing schedules for self-ranking, with the shown-first position balanced.

`reference` (the default) puts every episode in `per_episode` comparisons, like the reference
implementation (6 each); `round_robin` compares every pair. Pairs come from a circulant graph over
a seeded random permutation of the episodes: offsets 1..d/2 (plus the diameter when d is odd), so
the ring of offset 1 keeps the schedule connected, and orienting each edge along its offset gives
every episode the first position in half of its comparisons (within one), while which concrete
episode comes first varies from pair to pair.

Used by `mass rank`; no command of its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    first: int  # index shown first (label A)
    second: int
    repeat: int = 0  # 0..verdicts_per_pair-1 (and the swapped copy when both orders are asked)


def pairs(n: int, mode: str = "reference", per_episode: int = 6, seed: int = 0) -> list[tuple[int, int]]:
    """Oriented pairs (first, second) over range(n); connected for n >= 2."""
    if n < 2:
        raise ValueError(f"a pairing schedule needs at least 2 episodes, got {n}")
    if mode == "round_robin":
        d = n - 1
    elif mode == "reference":
        if per_episode < 1:
            raise ValueError(f"comparisons per episode must be >= 1, got {per_episode}")
        d = min(max(per_episode, 2 if n > 2 else 1), n - 1)  # degree 1 cannot connect more than 2 episodes
    else:
        raise ValueError(f"unknown pairing mode {mode!r} (expected 'reference' or 'round_robin')")
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    out: list[tuple[int, int]] = []
    seen: set[frozenset[int]] = set()

    def add(a: int, b: int) -> None:
        key = frozenset((perm[a], perm[b]))
        if len(key) == 2 and key not in seen:
            seen.add(key)
            out.append((perm[a], perm[b]))

    for s in range(1, d // 2 + 1):
        for i in range(n):
            add(i, (i + s) % n)
    if d % 2 == 1:
        half = n // 2
        if n % 2 == 0:  # the diameter: one more comparison each, shown first alternately
            for i in range(half):
                add(i, i + half) if i % 2 == 0 else add(i + half, i)
        else:  # odd n cannot be (odd d)-regular: offset n//2 gives every episode d+1 comparisons
            for i in range(n):
                add(i, (i + half) % n)
    return out


def schedule(
    n: int,
    mode: str = "reference",
    per_episode: int = 6,
    verdicts_per_pair: int = 1,
    both_orders: bool = False,
    seed: int = 0,
) -> list[Comparison]:
    """Every comparison to ask; repeats alternate orientation unless both orders are asked explicitly."""
    out: list[Comparison] = []
    for a, b in pairs(n, mode, per_episode, seed):
        for r in range(verdicts_per_pair):
            if both_orders:
                out.append(Comparison(a, b, r))
                out.append(Comparison(b, a, r))
            else:
                out.append(Comparison(a, b, r) if r % 2 == 0 else Comparison(b, a, r))
    return out


def is_connected(n: int, edges) -> bool:
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for e in edges:
        a, b = (e.first, e.second) if isinstance(e, Comparison) else e
        adj[a].add(b)
        adj[b].add(a)
    seen, todo = {0}, [0]
    while todo:
        for j in adj[todo.pop()] - seen:
            seen.add(j)
            todo.append(j)
    return len(seen) == n
