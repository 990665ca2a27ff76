"""Bradley–Terry scores against an independent implementation (choix) on random verdict sets."""

import math
import random

import choix
import numpy as np
import pytest

from mass_jobs.bradley_terry import fit, ranking


def choix_scores(n, outcomes, prior):
    """The same model through choix: scale so ties and the prior's virtual ties are whole games."""
    scale = round(2 / prior) if prior < 2 else 2  # prior virtual tie -> one game each way
    per_game = scale  # a real game becomes `scale` games; a tie half of them each way
    data = []
    for a, b, s in outcomes:
        data += [(a, b)] * round(s * per_game) + [(b, a)] * round((1 - s) * per_game)
    for i in range(n):  # the virtual reference player is item n
        data += [(i, n)] * round(prior * per_game / 2) + [(n, i)] * round(prior * per_game / 2)
    th = choix.ilsr_pairwise(n + 1, data, tol=1e-12, max_iter=100000)
    return th - th[n]


@pytest.mark.parametrize("prior", [0.1, 1.0])
@pytest.mark.parametrize("seed", range(8))
def test_matches_choix_on_random_verdicts(seed, prior):
    rng = random.Random(seed)
    n = rng.randint(3, 18)
    items = [f"ep-{i}" for i in range(n)]
    outcomes = []
    for _ in range(rng.randint(n, 4 * n)):
        a, b = rng.sample(range(n), 2)
        outcomes.append((a, b, rng.choice([0.0, 0.5, 1.0])))
    mine = fit(items, [(items[a], items[b], s) for a, b, s in outcomes], prior=prior)
    ref = choix_scores(n, outcomes, prior)
    assert np.allclose([mine[x] for x in items], ref[:n], atol=1e-6)
    assert ranking(mine) == [items[i] for i in sorted(range(n), key=lambda i: (-round(ref[i], 6), items[i]))]


def test_undefeated_episode_is_finite_and_first():
    scores = fit(["a", "b", "c"], [("a", "b", 1), ("a", "c", 1), ("b", "c", 1)], prior=0.1)
    assert all(math.isfinite(v) for v in scores.values())
    assert ranking(scores) == ["a", "b", "c"]
    assert scores["a"] > 0 > scores["c"] and scores["a"] == pytest.approx(-scores["c"])


def test_ties_count_as_half_wins_and_equal_scores_order_by_id():
    scores = fit(["b", "a"], [("a", "b", 0.5), ("b", "a", 0.5)], prior=0.1)
    assert scores["a"] == pytest.approx(scores["b"]) == pytest.approx(0.0)
    assert ranking(scores) == ["a", "b"]
    # one win and one loss is the same as two ties
    split = fit(["a", "b"], [("a", "b", 1), ("a", "b", 0)], prior=0.1)
    assert split["a"] == pytest.approx(scores["a"])
    # no verdicts at all: every score is the prior's 0, order by id
    assert ranking(fit(["ep-2", "ep-10", "ep-1"], [], prior=0.1)) == ["ep-1", "ep-10", "ep-2"]


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="prior"):
        fit(["a"], [], prior=0)
    with pytest.raises(KeyError, match="unknown item"):
        fit(["a", "b"], [("a", "z", 1)])
    with pytest.raises(ValueError, match="itself"):
        fit(["a", "b"], [("a", "a", 1)])
