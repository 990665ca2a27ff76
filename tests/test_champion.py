"""Upstream's champion rule (`search.selection: champion`, the default): which tasks are collected and
with which workflow.

Upstream judges every version v0..vK against the bare single-agent baseline. The champion starts as
v0; while it holds no baseline win, the first version that wins one takes it outright; afterwards a
version that also wins against the baseline takes it only by winning a direct champion-vs-version
verdict. A task is collected when the final champion holds a baseline win, and the teacher runs the
champion. `upstream_rule` below is written from that description, not from product code; the
simulation draws each verdict once per (pair, task) so both sides see the same judge, and counts
where the product (`judge_version` + `fold`, what `Search` runs) decides otherwise.
"""

from __future__ import annotations

import math
import random

import pytest

from mass_jobs.config.task_spec import Workflow
from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.judging.compare import Verdict
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, workflow_json
from mass_jobs.steps.collect import Collection
from mass_jobs.steps.search import Search
from mass_jobs.steps.search_state import IterationRecord, fold, judge_version
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, proposal

K = 11  # the paper's iterations: versions v0..v11
TASKS = 4_000  # enough that the option rule differs somewhere at every noise level (printed)


# ---------------------------------------------------------------- upstream, re-implemented


def upstream_rule(baseline: list[str], arbitrate) -> tuple[int, bool, int]:
    """(champion, champion holds a baseline win, arbitration calls) from the versions' verdicts
    against the baseline ("B": the version won, "A": the baseline, "tie", None: unreadable) and
    `arbitrate(champion, k)` -> "B" when version k beats the champion directly."""
    champion, has_win, calls = 0, baseline[0] == "B", 0
    for k in range(1, len(baseline)):
        if baseline[k] != "B":
            continue  # losses, ties and unreadable verdicts leave the champion alone
        if not has_win:
            champion, has_win = k, True
        else:
            calls += 1
            if arbitrate(champion, k) == "B":
                champion = k
    return champion, has_win, calls


# ---------------------------------------------------------------- a simulated judge


class SimulatedJudge:
    """Latent quality per version (a random walk from v0; the baseline its own draw); a verdict is
    B with probability sigmoid((q_b - q_a) / noise), a tie or unreadable with small probabilities.
    Each (task, a, b) is drawn once and remembered, so upstream and the product see one judge."""

    def __init__(self, seed: int, noise: float):
        self.rng, self.noise = random.Random(seed), noise
        self.baseline = self.rng.gauss(0.3, 1.0)
        q = [self.rng.gauss(0.0, 1.0)]
        for _ in range(K):
            q.append(q[-1] + self.rng.gauss(0.1, 0.6))
        self.q = q
        self.memo: dict[tuple, str | None] = {}

    def verdict(self, a, b) -> str | None:
        """ "A", "B", "tie" or None (unreadable) for a = baseline ("ref") or a version index."""
        if (a, b) not in self.memo:
            qa = self.baseline if a == "ref" else self.q[a]
            u = self.rng.random()
            if u < 0.03:
                self.memo[(a, b)] = None
            elif u < 0.08:
                self.memo[(a, b)] = "tie"
            else:
                p = 1 / (1 + math.exp(-(self.q[b] - qa) / self.noise))
                self.memo[(a, b)] = "B" if self.rng.random() < p else "A"
        return self.memo[(a, b)]


def as_verdict(label: str | None, a: str, b: str) -> Verdict:
    winner = {"A": a, "B": b, "tie": "tie"}[label] if label else None
    return Verdict(first=a, second=b, winner=winner, valid=label is not None, rationale=f"{label}", attempts=1)


def product_rule(judge: SimulatedJudge, selection: str = "champion") -> tuple[int, bool, int]:
    """What the product's search decides from the same judge: (best version, it beats the
    reference, direct best-vs-version calls)."""
    wf = workflow_json(DEFAULT_WORKFLOW)
    records = [
        IterationRecord(
            k=0,
            workflow=wf,
            outcome="success",
            preferred=True,
            elite_after=0,
            reference_verdict=as_verdict(judge.verdict("ref", 0), "reference", "iter-0"),
        )
    ]
    calls, best, best_wins = 0, 0, judge.verdict("ref", 0) == "B"
    for k in range(1, K + 1):

        def ask(against: str, k=k, best=best) -> Verdict:
            nonlocal calls
            if against == "reference":
                return as_verdict(judge.verdict("ref", k), "reference", f"iter-{k}")
            calls += 1
            return as_verdict(judge.verdict(best, k), f"iter-{best}", f"iter-{k}")

        verdict, ref_verdict, preferred = judge_version(selection, k, best_wins, ask)
        records.append(
            IterationRecord(
                k=k,
                workflow=wf,
                outcome="success",
                verdict=verdict,
                preferred=preferred,
                elite_after=k if preferred else best,
                reference_verdict=ref_verdict,
            )
        )
        if preferred:
            best, best_wins = k, ref_verdict is not None and ref_verdict.winner == f"iter-{k}"
    state = fold("t", 0, K, records, None, selection)  # the stored state says the same
    assert (state.elite, state.beats_reference) == (best, best_wins)
    return state.elite, state.beats_reference, calls


@pytest.mark.parametrize("noise", [0.25, 1.0, 4.0])
def test_collection_and_champion_equal_upstreams_on_simulated_searches(noise):
    collected = {"upstream": 0, "product": 0, "elite": 0}
    same = same_champion = elite_differs = 0
    for t in range(TASKS):
        judge = SimulatedJudge(seed=t * 7919 + int(noise * 1000), noise=noise)
        baseline = [judge.verdict("ref", k) for k in range(K + 1)]
        up = upstream_rule(baseline, judge.verdict)
        ours = product_rule(judge)
        same += (up[1] == ours[1]) and (not up[1] or up[0] == ours[0])
        same_champion += up[0] == ours[0]
        assert up[2] == ours[2], (t, up, ours)  # the same direct verdicts asked for
        collected["upstream"] += up[1]
        collected["product"] += ours[1]
        alt = product_rule(judge, "elite")  # Algorithm 1's elite, kept as an option
        collected["elite"] += alt[1]
        elite_differs += (alt[1] != up[1]) or (up[1] and alt[0] != up[0])
    share = same / TASKS
    print(
        f"noise {noise}: collected upstream {collected['upstream'] / TASKS:.4f}, product "
        f"{collected['product'] / TASKS:.4f}, elite rule {collected['elite'] / TASKS:.4f}; "
        f"decision and teacher equal on {share:.4%}; the elite rule differs on {elite_differs / TASKS:.2%}"
    )
    assert share >= 0.995 and same_champion / TASKS >= 0.995
    assert collected["product"] == collected["upstream"]
    # the option is a different rule, not a relabelled copy: it disagrees on some tasks
    assert elite_differs > 0


def test_the_rule_on_cases_written_out():
    """v0 loses; v1 wins (takes the crown, no direct verdict); v2 wins and beats v1 directly; v3
    wins but loses to v2; v4 ties the baseline: champion v2 after two direct verdicts."""
    table = {(1, 2): "B", (2, 3): "A"}
    assert upstream_rule(["A", "B", "B", "B", "tie"], lambda c, k: table[(c, k)]) == (2, True, 2)
    assert upstream_rule(["A", "A", None, "tie"], lambda c, k: "B") == (0, False, 0)  # v0 by default, no win
    assert upstream_rule(["B", "B"], lambda c, k: "A") == (0, True, 1)  # v0's own win is a win


# ---------------------------------------------------------------- through the real search


def test_search_judges_every_version_against_the_reference_and_arbitrates_winners(store, inner_spec, judging_endpoint):
    """Reference 5; v0 3 (loses), v1 6 (wins, takes the crown), v2 8 (wins, beats v1 directly),
    v3 7 (wins, loses to v2 directly): champion v2, collected with v2's workflow."""
    spec = inner_spec(
        store,
        search={"iterations": 3, "selection": "champion"},
        collection={"collect_when": "elite", "episodes": 2, "train_ranks": 1, "validation_rank": 2},
        ranking={"comparisons_per_episode": 1},
    )
    ep = judging_endpoint()
    add_episodes(ep, episode(5), episode(3))
    for k, score in ((1, 6), (2, 8), (3, 7)):
        ep.add("optimizer", Reply.text(proposal(f"v{k}", f"agent-{k}")))
        add_episodes(ep, episode(score))
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    state = Search(ctx, 0, "t1", client, episode_runner(spec, ep.endpoint)).run()

    assert state.selection == "champion" and state.elite == 2 and state.beats_reference
    assert state.beat_reference == [1, 2, 3]
    assert [r.preferred for r in state.iterations] == [True, True, True, False]
    assert [r.reference_verdict is not None for r in state.iterations] == [True] * 4
    assert [r.verdict is not None for r in state.iterations] == [False, False, True, True]
    assert [f.result for f in state.feedback] == ["initial", "new_elite", "new_elite", "elite_kept"]
    assert "against the champion iter-2" in state.feedback[3].rationale
    assert len(ep.verdicts) == 6  # four against the reference, two direct
    c = Collection(ctx, 0, "t1")
    assert c.skip_reason is None and c.version == 2
    assert Workflow.model_validate(c.workflow).agents[1].id == "agent-2"
