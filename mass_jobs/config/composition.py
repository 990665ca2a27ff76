"""Teacher-composition presets: which SFT windows a run trains on, in which shares, and how its
checkpoint is chosen, as named data (`sft.preset`).

The paper's method text does not define its S / M / X / S+ / M+ comparisons exactly; this project
defines them here and in docs/composition.md:

    preset  roles kept                      episodes   orchestrator share  checkpoint
    M       orchestrator, worker, auxiliary winners    1/3                 validation loss   (the paper)
    S       worker, auxiliary               winners    0                   validation loss
    X       orchestrator, worker, auxiliary all        1/3                 validation loss
    M+      as M                            winners    1/3                 judge panel
    S+      as S                            winners    0                   judge panel

"winners" are the ranked train episodes (ranks 1..train_ranks); "all" adds every other usable
ranked episode except the validation one. S is what a single-agent teacher
(`collection.teacher: single`) yields; on a team teacher it keeps the workers' windows only.
Evaluator and optimizer calls are not recorded as conversations, so they never become windows.

Render applies `roles` and `episodes`, training applies `orchestrator_share`, select applies
`checkpoint`. No CLI of its own: read by `mass render sft`, `mass train`, `mass select`,
`mass compare-runs` and the report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

WINDOW_ROLES = ("orchestrator", "worker", "auxiliary")


@dataclass(frozen=True)
class Composition:
    roles: tuple[str, ...]
    episodes: str  # "winners" | "all"
    orchestrator_share: float
    checkpoint: str  # "val_loss" | "panel"
    preset: str | None = None

    def to_dict(self) -> dict:
        return {**asdict(self), "roles": list(self.roles)}


_ALL = WINDOW_ROLES
_NO_ORCH = ("worker", "auxiliary")
PRESETS: dict[str, Composition] = {
    "M": Composition(_ALL, "winners", 1 / 3, "val_loss", "M"),
    "S": Composition(_NO_ORCH, "winners", 0.0, "val_loss", "S"),
    "X": Composition(_ALL, "all", 1 / 3, "val_loss", "X"),
    "M+": Composition(_ALL, "winners", 1 / 3, "panel", "M+"),
    "S+": Composition(_NO_ORCH, "winners", 0.0, "panel", "S+"),
}


def composition_of(sft) -> Composition:
    """The run's effective composition: its preset, else the spec's own fields (the paper's by default)."""
    if sft.preset is not None:
        return PRESETS[sft.preset]
    return Composition(_ALL, "winners", sft.orchestrator_share, sft.checkpoint_selection)


def training_episodes(ranking: dict, comp: Composition) -> list[str]:
    """Episode ids a task's rank manifest gives to training under `comp`: the winners, or every ranked
    episode but the validation one (best first)."""
    if comp.episodes == "winners":
        return list(ranking.get("train") or [])
    return [e for e in ranking.get("order") or [] if e != ranking.get("val")]


def keep_window(window, comp: Composition) -> bool:
    role = window["role"] if isinstance(window, dict) else window.role
    return role in comp.roles


def counts_by_role(windows: Iterable) -> dict[str, int]:
    c = Counter(w["role"] if isinstance(w, dict) else w.role for w in windows)
    return {r: c.get(r, 0) for r in WINDOW_ROLES}
