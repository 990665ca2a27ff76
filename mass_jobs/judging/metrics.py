"""Evaluation numbers as pure functions: win shares with confidence intervals, evaluator
agreement, behaviour-audit rates, token accounting and search coverage.

Everything here works on plain dicts/lists read from the store, so `mass report --spec S` can
recompute every number of the report from stored artifacts alone (and tests can check them by hand).

Verdict records (written by `mass_jobs.judging.judges`) carry the blind label the judge chose and the
order the pair was shown in; the outcome from the candidate's side is derived here, never trusted
from a stored field:
    {"task", "replicate", "candidate", "baseline", "judge", "seed",
     "order": "candidate_first" | "baseline_first", "winner": "A" | "B" | "tie" | None, "valid": bool}
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

OUTCOMES = ("win", "loss", "tie", "invalid")


def outcome(verdict: Mapping) -> str:
    """The candidate's outcome of one verdict: win / loss / tie / invalid.

    Invalid verdicts are never counted as ties: they are a separate bucket."""
    if not verdict.get("valid") or verdict.get("winner") not in ("A", "B", "tie"):
        return "invalid"
    if verdict["winner"] == "tie":
        return "tie"
    order = verdict.get("order")
    if order not in ("candidate_first", "baseline_first"):
        raise ValueError(f"verdict order must be 'candidate_first' or 'baseline_first', got {order!r}")
    candidate_label = "A" if order == "candidate_first" else "B"
    return "win" if verdict["winner"] == candidate_label else "loss"


@dataclass
class Tally:
    wins: int = 0
    losses: int = 0
    ties: int = 0
    invalid: int = 0

    def add(self, result: str) -> None:
        if result == "win":
            self.wins += 1
        elif result == "loss":
            self.losses += 1
        elif result == "tie":
            self.ties += 1
        elif result == "invalid":
            self.invalid += 1
        else:
            raise ValueError(f"unknown outcome {result!r}; expected one of {OUTCOMES}")

    @property
    def decisive(self) -> int:
        return self.wins + self.losses

    def as_dict(self) -> dict:
        return {"wins": self.wins, "losses": self.losses, "ties": self.ties, "invalid": self.invalid}


def win_share(wins: int, losses: int) -> float | None:
    """wins / (wins + losses), ties excluded; None when there is no decisive verdict."""
    n = wins + losses
    return wins / n if n else None


def wilson_interval(wins: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion (good at small n and at 0 or 1)."""
    if n <= 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = wins / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_over_tasks(
    per_task: Mapping[str, tuple[int, int]], resamples: int, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap of the pooled win share, resampling TASKS with replacement.

    Tasks are the unit of variation (verdicts within a task are correlated), so the interval
    widens honestly when only a few tasks decide the result. Resamples whose tasks have no
    decisive verdict are skipped. Deterministic for a given seed."""
    tasks = sorted(per_task)
    if not tasks or resamples <= 0 or sum(w + lost for w, lost in per_task.values()) == 0:
        return None
    rng = random.Random(seed)
    shares: list[float] = []
    for _ in range(resamples):
        wins = losses = 0
        for _ in tasks:
            w, lost = per_task[tasks[rng.randrange(len(tasks))]]
            wins += w
            losses += lost
        if wins + losses:
            shares.append(wins / (wins + losses))
    if not shares:
        return None
    shares.sort()
    alpha = (1 - confidence) / 2
    return (_quantile(shares, alpha), _quantile(shares, 1 - alpha))


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Comparison:
    """Win share of one candidate generation against one baseline generation on one split."""

    per_task: dict[str, Tally] = field(default_factory=dict)

    @property
    def overall(self) -> Tally:
        total = Tally()
        for t in self.per_task.values():
            total.wins += t.wins
            total.losses += t.losses
            total.ties += t.ties
            total.invalid += t.invalid
        return total


def compare(verdicts: Iterable[Mapping], tasks: Iterable[str]) -> Comparison:
    """Tally verdicts per task (every listed task appears, even with no verdict)."""
    comp = Comparison(per_task={t: Tally() for t in sorted(set(tasks))})
    for v in verdicts:
        if v["task"] in comp.per_task:
            comp.per_task[v["task"]].add(outcome(v))
    return comp


def overall_interval(
    per_task: Mapping[str, tuple[int, int]], resamples: int, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """The pooled win share's interval: the envelope of the bootstrap over tasks (the spread between
    tasks) and the Wilson interval of the pooled verdicts (the noise of the verdicts themselves).

    Either alone can lie: with one decisive task, or tasks that happen to agree, every task resample
    has the same share and the bootstrap is a point; with tasks that disagree, the pooled Wilson
    interval ignores that verdicts within a task are correlated. The envelope is never narrower than
    either, and never zero-width while a verdict is decisive."""
    wins = sum(w for w, _ in per_task.values())
    n = wins + sum(lost for _, lost in per_task.values())
    pooled = wilson_interval(wins, n, confidence)
    tasks = bootstrap_over_tasks(per_task, resamples, confidence, seed)
    if pooled is None or tasks is None:
        return pooled or tasks
    return (min(pooled[0], tasks[0]), max(pooled[1], tasks[1]))


def comparison_summary(comp: Comparison, confidence: float, resamples: int, seed: int = 0) -> dict:
    """JSON block of the report: per-task Wilson intervals, the overall interval (`overall_interval`)."""
    per_task = {}
    for task, t in comp.per_task.items():
        per_task[task] = {
            **t.as_dict(),
            "win_share": win_share(t.wins, t.losses),
            "ci": _pair(wilson_interval(t.wins, t.decisive, confidence)),
        }
    total = comp.overall
    counts = {task: (t.wins, t.losses) for task, t in comp.per_task.items()}
    return {
        **total.as_dict(),
        "win_share": win_share(total.wins, total.losses),
        "ci": _pair(overall_interval(counts, resamples, confidence, seed)),
        "per_task": per_task,
    }


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


# ---------------------------------------------------------------- evaluator agreement


def pair_key(v: Mapping) -> tuple:
    return (v["task"], int(v["replicate"]), int(v["candidate"]), int(v["baseline"]))


NO_MAJORITY = "no majority"


def panel_majority(verdicts: Iterable[Mapping]) -> str | None:
    """The panel's call on one pair from the candidate's side: the outcome ('win', 'loss' or
    'tie') held by more than half of the valid verdicts; NO_MAJORITY when none is (a 1/1/1 or a
    1/1 split is a panel that did not decide, not a panel that called a tie); None when no
    verdict is valid."""
    t = Tally()
    for v in verdicts:
        t.add(outcome(v))
    valid = t.wins + t.losses + t.ties
    if valid == 0:
        return None
    for call, n in (("win", t.wins), ("loss", t.losses), ("tie", t.ties)):
        if 2 * n > valid:
            return call
    return NO_MAJORITY


def agreement(self_verdicts: Iterable[Mapping], panel_verdicts: Iterable[Mapping]) -> dict:
    """Share of pairs on which the self-evaluator's (valid) call equals the panel majority.

    Pairs count only when both sides have a call; `pairs` says how many did. A pair whose panel
    has no majority is neither agreement nor disagreement: it is counted in `no_majority`."""
    by_pair: dict[tuple, list[Mapping]] = {}
    for v in panel_verdicts:
        by_pair.setdefault(pair_key(v), []).append(v)
    agree = pairs = no_majority = 0
    for v in self_verdicts:
        mine = outcome(v)
        panel = panel_majority(by_pair.get(pair_key(v), []))
        if mine == "invalid" or panel is None:
            continue
        if panel == NO_MAJORITY:
            no_majority += 1
            continue
        pairs += 1
        agree += mine == panel
    return {"agree": agree, "pairs": pairs, "no_majority": no_majority, "rate": (agree / pairs) if pairs else None}


def position_counts(verdicts: Iterable[Mapping]) -> dict:
    """Which blind label the valid decisive verdicts chose, and in which order the pair was shown.

    A judge that answers by position picks one label whatever the order; over position-balanced
    pairs its win share is then 50% by construction and says nothing about the workspaces."""
    counts = {"A": 0, "B": 0, "candidate_first": 0, "baseline_first": 0}
    for v in verdicts:
        if outcome(v) in ("win", "loss"):
            counts[v["winner"]] += 1
            counts[v["order"]] += 1
    return counts


def position_bias_note(counts: Mapping[str, int]) -> str | None:
    """A note when every decisive verdict chose the same label although both orders were shown
    (at least two verdicts); None otherwise."""
    n = counts["A"] + counts["B"]
    if n < 2 or not (counts["candidate_first"] and counts["baseline_first"]) or (counts["A"] and counts["B"]):
        return None
    label, place = ("A", "first") if counts["A"] else ("B", "second")
    return (
        f"position bias: all {n} decisive verdicts chose Workspace {label} (the one shown {place}) "
        f"although both orders were shown; this win share measures the judge's order preference, "
        f"not the workspaces"
    )


# ---------------------------------------------------------------- behaviour audit, tokens, search


def audit_rates(audits: Iterable[Mapping]) -> dict:
    """D/H counts over episodes (an episode counts once however many delegations it made)."""
    episodes = delegation = handoff = 0
    for a in audits:
        episodes += 1
        delegation += bool(a.get("delegation"))
        handoff += bool(a.get("code_handoff"))
    return {
        "episodes": episodes,
        "delegation": delegation,
        "code_handoff": handoff,
        "delegation_rate": delegation / episodes if episodes else None,
        "code_handoff_rate": handoff / episodes if episodes else None,
    }


def generated_tokens(statuses: Iterable[Mapping]) -> int:
    """All model output of episodes: completion tokens summed over episode status records."""
    return sum(int((s.get("tokens") or {}).get("completion") or 0) for s in statuses)


def processed_tokens(log: Iterable[Mapping], selected_step: int | None) -> dict:
    """Supervised tokens the optimizer processed: up to the selected checkpoint and to the end.

    Log lines with a `step` and a cumulative `processed_tokens` (the training log's contract);
    validation-only lines are ignored."""
    upto = end = 0
    for line in log:
        if "processed_tokens" not in line or "step" not in line:
            continue
        n = int(line["processed_tokens"])
        end = max(end, n)
        if selected_step is not None and int(line["step"]) <= selected_step:
            upto = max(upto, n)
    return {"to_selected": upto if selected_step is not None else None, "to_end": end}


def search_coverage(beats_by_iteration: Mapping[str, list[bool]], iterations: int) -> list[int]:
    """Tasks whose elite beat the bare reference after iteration k, for k = 0..iterations.

    `beats_by_iteration[task][k]` says whether the elite held after iteration k beat the reference
    (runs are not monotone: a new elite may lose to the reference); a task that stopped early keeps
    its last value."""
    counts = []
    for k in range(iterations + 1):
        counts.append(sum(1 for flags in beats_by_iteration.values() if flags and flags[min(k, len(flags) - 1)]))
    return counts
