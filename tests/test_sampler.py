"""Sampler: uniform tasks, orchestrator share, replacement, and draws that depend only on (seed, rank, step)."""

from __future__ import annotations

from collections import Counter

import pytest

from mass_jobs.training.sampler import WindowSampler

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)


def windows() -> list[dict]:
    out = []
    # task "a": many worker windows; "b": few; "c": only workers (no orchestrator window at all)
    for task, n_orch, n_other in (("a", 2, 40), ("b", 1, 3), ("c", 0, 5)):
        out += [{"task": task, "role": "orchestrator", "input_ids": [1] * 8, "n_supervised": 3}] * n_orch
        out += [{"task": task, "role": "worker", "input_ids": [1] * 9, "n_supervised": 4}] * n_other
    return [dict(w, i=i) for i, w in enumerate(out)]


def test_tasks_uniform_and_orchestrator_share():
    ws = windows()
    s = WindowSampler(ws, orchestrator_share=1 / 3, seed=7)
    draws = [ws[s.draw(step, rank)] for step in range(3000) for rank in range(2)]
    tasks = Counter(w["task"] for w in draws)
    for t in "abc":
        assert abs(tasks[t] / len(draws) - 1 / 3) < 0.03, tasks  # task-uniform, not window-uniform
    for t in "ab":
        share = sum(w["role"] == "orchestrator" for w in draws if w["task"] == t) / tasks[t]
        assert abs(share - 1 / 3) < 0.04, (t, share)
    assert all(w["role"] == "worker" for w in draws if w["task"] == "c")  # falls back to what exists
    # with replacement: the single orchestrator window of "b" is drawn many times
    assert Counter(w["i"] for w in draws)[42] > 100


def test_draws_are_a_function_of_seed_rank_step():
    ws = windows()
    a, b = WindowSampler(ws, 1 / 3, seed=3), WindowSampler(ws, 1 / 3, seed=3)
    full = [a.draw(step, 1, m) for step in range(50) for m in range(2)]
    resumed = [b.draw(step, 1, m) for step in range(20, 50) for m in range(2)]  # a fresh sampler after resume
    assert resumed == full[40:]
    assert full != [a.draw(step, 0, m) for step in range(50) for m in range(2)]  # ranks draw differently
    assert full != [WindowSampler(ws, 1 / 3, seed=4).draw(step, 1, m) for step in range(50) for m in range(2)]
    assert a.state()["fingerprint"] == b.state()["fingerprint"]


@pytest.mark.parametrize("share,expected", [(0.0, "worker"), (1.0, "orchestrator")], ids=["share-0", "share-1"])
def test_extreme_shares(share, expected):
    ws = windows()
    s = WindowSampler(ws, share, seed=0)
    roles = {ws[s.draw(k, 0)]["role"] for k in range(300) if ws[s.draw(k, 0)]["task"] != "c"}
    assert roles == {expected}


def test_empty_windows_rejected():
    with pytest.raises(ValueError, match="train.jsonl is empty"):
        WindowSampler([], 1 / 3, seed=0)
