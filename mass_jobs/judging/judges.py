"""The judge panel: blind, position-balanced pairwise verdicts on two workspaces.

Used by the evaluate step (`mass evaluate --spec S --gen G`) for the external panel
(`spec.judges`: each judge x each of its seeds = one verdict per pair) and for the
self-evaluator (the generation's own model, one verdict per pair) whose agreement with the
panel the report shows. Reporting only: nothing here feeds search, ranking or selection.

- Blind: the judge sees "Workspace A" / "Workspace B", never a generation or a path.
- Position balanced: the order alternates over a judge's seeds and starts on opposite sides for
  consecutive judges, so every pair is seen in both orders when a judge has two or more seeds.
- Structured: the answer must be a JSON verdict {"winner": "A"|"B"|"tie", "rationale": "..."};
  a malformed answer is retried with a correction, a failing endpoint is retried, and after the
  retries the verdict is recorded as INVALID (never as a tie, never a crash).
- Resumable: each verdict is its own store object; a rerun skips verdicts already stored.

Bundles and the verdict exchange itself are `mass_jobs.judging.compare`'s (the same evidence and prompt the
self-evaluator uses in search and ranking), so the panel and the self-evaluator judge identical views
and their agreement is meaningful. This module adds the panel around it: order, storage, failures.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from mass_jobs.judging import compare
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelError


class ChatClient(Protocol):
    def chat(
        self,
        messages: list[dict],
        tools: Any = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        headers: dict | None = None,
    ) -> dict: ...


@dataclass(frozen=True)
class PairJob:
    """One workspace pair: candidate generation vs baseline generation on (task, replicate)."""

    task: str
    replicate: int
    candidate: int
    baseline: int
    task_prompt: str
    candidate_bundle: str
    baseline_bundle: str

    @property
    def name(self) -> str:
        return RunContext.verdict_pair(f"gen-{self.candidate}", f"gen-{self.baseline}", self.task, self.replicate)


@dataclass(frozen=True)
class PanelMember:
    name: str
    model: str
    seeds: tuple[int, ...]
    client: ChatClient
    kind: str = "panel"  # "panel" or "self"


# ---------------------------------------------------------------- one verdict


def order_for(job: PairJob, judge_index: int, seed_index: int, seed: int | None = None, rule: str = "balanced") -> str:
    """`balanced`: alternate over seeds, start on opposite sides for consecutive judges, and let the
    pair itself pick the starting side (so position is balanced over pairs too). `seeded` (the
    paper's code): the seed alone decides, the baseline first where random.Random(seed) draws True
    from [False, True]."""
    if rule == "seeded":
        return "baseline_first" if random.Random(seed).choice([False, True]) else "candidate_first"
    parity = hashlib.sha256(job.name.encode()).digest()[0] % 2
    return "candidate_first" if (seed_index + judge_index + parity) % 2 == 0 else "baseline_first"


def ask_verdict(client: ChatClient, job: PairJob, order: str, seed: int, retries: int) -> dict:
    """One verdict via `compare.judge`; an endpoint failure (ModelError: unreachable, timeout, HTTP
    error, a reply that is no chat completion) is retried, then recorded invalid. Any other error is
    a bug of this code and propagates: stored as an invalid verdict, `run_panel` would reuse it forever."""

    cand, base = ("candidate", job.candidate_bundle), ("baseline", job.baseline_bundle)
    first, second = (cand, base) if order == "candidate_first" else (base, cand)
    errors: list[str] = []
    for _ in range(retries + 1):
        try:
            v = compare.judge(client, job.task_prompt, first, second, retries=retries, seed=seed)
        except ModelError as e:  # endpoint down, HTTP error, timeout: recorded, retried, never a crash
            errors.append(f"endpoint: {type(e).__name__}: {e}"[:500])
            continue
        winner = None if not v.valid else "tie" if v.winner == "tie" else ("A" if v.winner == first[0] else "B")
        return {
            "order": order,
            "winner": winner,
            "valid": v.valid,
            "rationale": v.rationale or None,
            "attempts": len(errors) + v.attempts,
            "errors": errors + list(v.errors),
        }
    return {
        "order": order,
        "winner": None,
        "valid": False,
        "rationale": None,
        "attempts": len(errors),
        "errors": errors,
    }


# ---------------------------------------------------------------- the panel


def verdict_key(prefix: str, job: PairJob, member: PanelMember, seed: int) -> str:
    return RunContext.verdict_file(prefix, job.name, f"{member.kind}-{member.name}", seed)


def run_panel(
    store,
    prefix: str,
    jobs: Iterable[PairJob],
    members: list[PanelMember],
    retries: int,
    on_verdict: Callable[[dict], None] | None = None,
    first_index: int = 0,
    order: str = "balanced",
) -> list[dict]:
    """Every member's verdicts on every job, stored under `prefix`; stored ones are reused.

    `first_index` is the panel position of `members[0]`, for callers that run one judge at a time
    (each local judge needs its own server) but want the panel's order balance; `order` is the
    `order_for` rule (`evaluation.panel_order`)."""
    records = []
    for job in jobs:
        for ji, member in enumerate(members, start=first_index):
            for si, seed in enumerate(member.seeds):
                key = verdict_key(prefix, job, member, seed)
                if store.exists(key):
                    record = store.get_json(key)
                else:
                    result = ask_verdict(member.client, job, order_for(job, ji, si, seed, order), seed, retries)
                    record = {
                        "task": job.task,
                        "replicate": job.replicate,
                        "candidate": job.candidate,
                        "baseline": job.baseline,
                        "judge": member.name,
                        "kind": member.kind,
                        "model": member.model,
                        "seed": seed,
                        **result,
                    }
                    store.put_json(key, record)
                records.append(record)
                if on_verdict:
                    on_verdict(record)
    return records


def load_verdicts(store, prefix: str) -> list[dict]:
    """All stored verdict records under `prefix` (panel and self), in key order."""
    return [store.get_json(k) for k in store.list(prefix + "/") if k.endswith(".json") and "/_" not in k]
