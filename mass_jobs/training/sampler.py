"""Window sampler for LoRA SFT: task uniform, then orchestrator vs worker/auxiliary, with replacement.

MASS samples a task uniformly, then an orchestrator window with probability `orchestrator_share`
(1/3 in the paper) and a worker/auxiliary window otherwise, always with replacement ("two
nominal epochs" does not mean each window is seen twice). A task without windows of the drawn
kind falls back to its other kind, so every draw yields a window.

Every draw is a pure function of (seed, rank, step, micro-step): a resumed run draws exactly the
windows the uninterrupted run would have, with no sampler state to restore. Used by `mass train`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence


class WindowSampler:
    def __init__(self, windows: Sequence[dict], orchestrator_share: float, seed: int):
        if not windows:
            raise ValueError("sampler needs at least one window (sft/train.jsonl is empty)")
        if not 0.0 <= orchestrator_share <= 1.0:
            raise ValueError(f"orchestrator_share must be in [0, 1], got {orchestrator_share}")
        self.seed = seed
        self.orchestrator_share = orchestrator_share
        groups: dict[str, tuple[list[int], list[int]]] = {}
        for i, w in enumerate(windows):
            orch, other = groups.setdefault(str(w["task"]), ([], []))
            (orch if w["role"] == "orchestrator" else other).append(i)
        self.tasks = sorted(groups)
        self.groups = groups
        # A fingerprint of what is sampled from: a resume against different data must be refused.
        h = hashlib.sha256()
        for w in windows:
            h.update(f"{w['task']}|{w['role']}|{len(w['input_ids'])}|{w.get('n_supervised')};".encode())
        self.fingerprint = h.hexdigest()[:16]

    def draw(self, step: int, rank: int, micro: int = 0) -> int:
        """Index of the window for this (step, rank, micro-step)."""
        rng = random.Random(f"{self.seed}:{rank}:{step}:{micro}")  # str seeds hash stably across processes
        orch, other = self.groups[rng.choice(self.tasks)]
        pick_orch = rng.random() < self.orchestrator_share
        pool = (orch if pick_orch else other) or (other if pick_orch else orch)
        return rng.choice(pool)

    def state(self) -> dict:
        return {
            "seed": self.seed,
            "orchestrator_share": self.orchestrator_share,
            "tasks": self.tasks,
            "fingerprint": self.fingerprint,
            "scheme": "random.Random(f'{seed}:{rank}:{step}:{micro}')",
        }
