"""Evaluation metrics against numbers computed by hand."""

import pytest

from mass_jobs.judging import metrics

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)


def v(task, winner, order="candidate_first", rep=0, valid=True, cand=1, base=0, judge="j", seed=1):
    return {
        "task": task,
        "replicate": rep,
        "candidate": cand,
        "baseline": base,
        "judge": judge,
        "seed": seed,
        "order": order,
        "winner": winner,
        "valid": valid,
    }


@pytest.mark.parametrize(
    "winner,order,expected",
    [
        ("A", "candidate_first", "win"),
        ("B", "candidate_first", "loss"),
        ("A", "baseline_first", "loss"),
        ("B", "baseline_first", "win"),
        ("tie", "baseline_first", "tie"),
        (None, "candidate_first", "invalid"),
    ],
    ids=["A-first-win", "B-first-loss", "A-swapped-loss", "B-swapped-win", "tie", "missing-invalid"],
)
def test_outcome_unswaps_blind_labels(winner, order, expected):
    assert metrics.outcome(v("t", winner, order, valid=winner is not None)) == expected


def test_invalid_verdict_is_never_a_tie_even_if_it_says_tie():
    assert metrics.outcome(v("t", "tie", valid=False)) == "invalid"


def test_win_share_excludes_ties_and_invalid():
    comp = metrics.compare(
        [
            v("a", "A"),
            v("a", "A"),
            v("a", "B"),
            v("a", "tie"),
            v("a", None, valid=False),
            v("b", "B", "baseline_first"),
            v("b", "A", "baseline_first"),
        ],
        tasks=["a", "b", "c"],
    )
    assert comp.per_task["a"].as_dict() == {"wins": 2, "losses": 1, "ties": 1, "invalid": 1}
    assert comp.per_task["c"].as_dict() == {"wins": 0, "losses": 0, "ties": 0, "invalid": 0}
    total = comp.overall
    assert (total.wins, total.losses, total.ties, total.invalid) == (3, 2, 1, 1)
    assert metrics.win_share(total.wins, total.losses) == pytest.approx(3 / 5)
    assert metrics.win_share(0, 0) is None


def test_wilson_interval_matches_hand_computation():
    # 7 of 10 at 95%: z = 1.959964, centre = 0.644486, half-width = 0.247712
    lo, hi = metrics.wilson_interval(7, 10, 0.95)
    assert lo == pytest.approx(0.396773, abs=1e-5)
    assert hi == pytest.approx(0.892200, abs=1e-5)
    # 0 of 5: the lower bound is exactly 0, the upper bound z^2/(n+z^2) = 3.841459/8.841459
    lo, hi = metrics.wilson_interval(0, 5, 0.95)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.434482, abs=1e-5)
    assert metrics.wilson_interval(0, 0) is None


def test_bootstrap_over_tasks_two_tasks():
    # Resampling 2 tasks from {(3,1), (1,3)} gives 0.75, 0.5 or 0.25 with probability 1/4, 1/2, 1/4,
    # so the 95% percentile interval is exactly [0.25, 0.75].
    lo, hi = metrics.bootstrap_over_tasks({"a": (3, 1), "b": (1, 3)}, resamples=2000, confidence=0.95, seed=0)
    assert (lo, hi) == (0.25, 0.75)
    # identical tasks: no spread
    assert metrics.bootstrap_over_tasks({"a": (2, 2), "b": (1, 1)}, 500, 0.9) == (0.5, 0.5)
    assert metrics.bootstrap_over_tasks({"a": (0, 0)}, 500, 0.9) is None
    # deterministic for a seed
    counts = {"a": (5, 1), "b": (2, 4), "c": (3, 3)}
    assert metrics.bootstrap_over_tasks(counts, 300, seed=4) == metrics.bootstrap_over_tasks(counts, 300, seed=4)


def test_comparison_summary_block():
    comp = metrics.compare([v("a", "A")] * 7 + [v("a", "B")] * 3 + [v("b", "tie")], tasks=["a", "b"])
    s = metrics.comparison_summary(comp, confidence=0.95, resamples=200)
    assert s["wins"] == 7 and s["losses"] == 3 and s["ties"] == 1 and s["win_share"] == pytest.approx(0.7)
    assert s["per_task"]["a"]["ci"] == pytest.approx([0.396773, 0.892200], abs=1e-5)
    assert s["per_task"]["b"]["win_share"] is None and s["per_task"]["b"]["ci"] is None
    # only task a is decisive: every task resample has share 0.7, so the verdicts' own Wilson
    # interval (7 of 10) is what is left, never a point
    assert s["ci"] == pytest.approx([0.396773, 0.892200], abs=1e-5)


@pytest.mark.parametrize(
    "per_task,want",
    [
        ({"only": (3, 1)}, (0.300642, 0.954413)),  # one task, 3-1: Wilson 3 of 4, not [75, 75]
        ({"only": (2, 0)}, (0.342380, 1.0)),  # 2-0 is not distinguishable from noise
        ({"a": (2, 0), "b": (2, 0)}, (0.510109, 1.0)),  # tasks that agree: the bootstrap is a point
    ],
)
def test_the_overall_interval_is_never_a_point_while_a_verdict_is_decisive(per_task, want):
    lo, hi = metrics.overall_interval(per_task, resamples=500)
    assert (lo, hi) == pytest.approx(want, abs=1e-5) and hi - lo > 0.04
    assert metrics.overall_interval({"a": (0, 0)}, resamples=500) is None


def test_the_overall_interval_keeps_the_spread_between_tasks():
    counts = {"a": (9, 1), "b": (1, 9), "c": (9, 1)}
    boot = metrics.bootstrap_over_tasks(counts, 2000, seed=0)
    pooled = metrics.wilson_interval(19, 30)
    assert metrics.overall_interval(counts, 2000) == (min(boot[0], pooled[0]), max(boot[1], pooled[1]))
    assert boot[0] < pooled[0]  # here the tasks' spread is the wider side


def test_panel_majority_and_agreement():
    panel = (
        [v("a", "A", rep=0, judge="x"), v("a", "A", rep=0, judge="y"), v("a", "B", rep=0, judge="z")]  # win 2 of 3
        + [v("a", "B", rep=1), v("a", "B", rep=1, seed=2), v("a", "tie", rep=1, seed=3)]  # loss 2 of 3
        + [v("a", "A", rep=2), v("a", "B", rep=2)]  # 1 win 1 loss: no majority
        + [v("a", None, rep=3, valid=False)]  # no call
        + [v("a", "tie", rep=4), v("a", "tie", rep=4, seed=2), v("a", None, rep=4, valid=False, seed=3)]  # tie
    )
    assert metrics.panel_majority([p for p in panel if p["replicate"] == 0]) == "win"
    assert metrics.panel_majority([p for p in panel if p["replicate"] == 1]) == "loss"
    assert metrics.panel_majority([p for p in panel if p["replicate"] == 2]) == metrics.NO_MAJORITY
    assert metrics.panel_majority([p for p in panel if p["replicate"] == 3]) is None
    assert metrics.panel_majority([p for p in panel if p["replicate"] == 4]) == "tie"  # 2 of 2 valid
    own = [
        v("a", "B", "baseline_first", rep=0),  # win: agrees
        v("a", "A", rep=1),  # win vs loss: disagrees
        v("a", "tie", rep=2),  # split panel: no majority, neither agreement nor disagreement
        v("a", "A", rep=3),  # panel has no call: not counted
        v("a", "tie", rep=4),  # tie: agrees
        v("a", None, rep=0, valid=False, cand=2),  # invalid self verdict: not counted
    ]
    assert metrics.agreement(own, panel) == {"agree": 2, "pairs": 3, "no_majority": 1, "rate": pytest.approx(2 / 3)}
    assert metrics.agreement([], panel)["rate"] is None


def test_split_panel_is_no_majority_not_disagreement():
    # three judges, one win, one loss, one tie on every pair: the panel never decides
    panel = [
        v(t, w, rep=r, judge=j) for t in ("a", "b") for r in (0, 1) for j, w in (("x", "A"), ("y", "B"), ("z", "tie"))
    ]
    own = [v(t, "A", rep=r, judge="gen-1") for t in ("a", "b") for r in (0, 1)]
    assert metrics.agreement(own, panel) == {"agree": 0, "pairs": 0, "no_majority": 4, "rate": None}


def test_position_bias_note_only_when_every_decisive_verdict_takes_one_label():
    # a judge that always answers "A": wins when the candidate is first, losses when it is second
    first_always = (
        [v("a", "A", "candidate_first", rep=r) for r in range(3)]
        + [v("a", "A", "baseline_first", rep=r) for r in range(3)]
        + [v("a", "tie"), v("a", None, valid=False)]
    )
    counts = metrics.position_counts(first_always)
    assert counts == {"A": 6, "B": 0, "candidate_first": 3, "baseline_first": 3}
    comp = metrics.compare(first_always, ["a"]).overall
    assert metrics.win_share(comp.wins, comp.losses) == 0.5  # 50% by construction
    note = metrics.position_bias_note(counts)
    assert note.startswith("position bias: all 6 decisive verdicts chose Workspace A (the one shown first)")
    second = metrics.position_counts([v("a", "B", "candidate_first"), v("a", "B", "baseline_first")])
    assert "all 2 decisive verdicts chose Workspace B (the one shown second)" in metrics.position_bias_note(second)
    # both labels used, only one order shown, or a single verdict: no note
    assert (
        metrics.position_bias_note(
            metrics.position_counts(
                [v("a", "A", "candidate_first"), v("a", "B", "baseline_first"), v("a", "A", "baseline_first")]
            )
        )
        is None
    )
    assert metrics.position_bias_note(metrics.position_counts([v("a", "A", rep=r) for r in range(5)])) is None
    assert metrics.position_bias_note(metrics.position_counts([v("a", "A", "baseline_first")])) is None


def test_audit_rates_tokens_and_coverage():
    audits = [
        {"delegation": True, "code_handoff": False},
        {"delegation": True, "code_handoff": True},
        {"delegation": False, "code_handoff": False},
        {"delegation": 0},
    ]
    assert metrics.audit_rates(audits) == {
        "episodes": 4,
        "delegation": 2,
        "code_handoff": 1,
        "delegation_rate": 0.5,
        "code_handoff_rate": 0.25,
    }
    assert metrics.generated_tokens([{"tokens": {"completion": 12, "prompt": 99}}, {"tokens": {}}, {}]) == 12
    log = [
        {"step": 1, "processed_tokens": 100},
        {"step": 2, "processed_tokens": 230},
        {"step": 2, "val_loss": 1.0},
        {"step": 3, "processed_tokens": 370},
    ]
    assert metrics.processed_tokens(log, selected_step=2) == {"to_selected": 230, "to_end": 370}
    assert metrics.processed_tokens(log, selected_step=None) == {"to_selected": None, "to_end": 370}
    beats = {"a": [True, True, True, True], "b": [False, False, True, False], "c": [False] * 4, "d": [False, True]}
    assert metrics.search_coverage(beats, iterations=3) == [1, 2, 3, 2]
    assert metrics.search_coverage({}, iterations=1) == [0, 0]
