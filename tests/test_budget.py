"""The suite's own time budget (tests/fixtures/budget.py): the verdict line and the machine's busy share."""

from __future__ import annotations

import sys

import pytest

from tests.fixtures.budget import busy_share, machine_ticks, verdict

pytestmark = pytest.mark.unit


def test_a_tier_fails_only_past_its_budget_and_slack():
    assert verdict(359.0, 300.0, 0.2) == (False, "wall time 359 s of a 300 s budget (fails past 360 s): within budget")
    over, line = verdict(361.0, 300.0, 0.2)
    assert over and line.endswith("OVER BUDGET")
    assert verdict(5000.0, None, 0.2) == (False, "wall time 5000 s (no budget set)")


def test_busy_share_is_busy_ticks_over_all_ticks_between_two_readings():
    assert busy_share((100, 1000), (250, 1200)) == pytest.approx(0.75)
    assert busy_share((100, 1000), (100, 1000)) is None  # no time passed
    assert busy_share(None, (1, 2)) is None and busy_share((1, 2), None) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_the_machine_reading_counts_busy_within_total_and_only_grows():
    first = machine_ticks()
    sum(i * i for i in range(200_000))  # some CPU between the readings
    second = machine_ticks()
    assert first and second
    assert 0 <= first[0] <= first[1] and 0 <= second[0] <= second[1]
    assert second[1] >= first[1] and second[0] >= first[0]
    share = busy_share(first, second)
    assert share is None or 0.0 <= share <= 1.0
