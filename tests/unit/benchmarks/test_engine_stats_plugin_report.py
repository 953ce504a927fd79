"""The plugin-cost section's verdict and resolution, from the rounds' throughput and the timed cost."""

from __future__ import annotations

import random

import pytest

from benchmarks.engine_stats_plugin import Run, median_interval, report

RUN = Run("cmd", 8, 48, 64, 8, "rev", "machine")
CHEAP = {0: 27.3, 1: 37.7, 8: 89.7}
"""µs per record() call: 0.045 % of one core at 4.6 requests a second."""
COSTLY = {0: 900.0, 1: 3000.0, 8: 9000.0}
"""µs per record() call: over 1 % of one core at the same rate."""


@pytest.mark.parametrize("n", [6, 8, 12, 20])
def test_the_median_interval_covers_the_median_as_often_as_it_says(n: int) -> None:
    """Drawn from a distribution whose median is 0, the interval holds 0 in about its stated share of trials."""
    rng = random.Random(n)
    trials, covered, coverage = 4000, 0, 0.0
    for _ in range(trials):
        found = median_interval([rng.gauss(0, 1) for _ in range(n)])
        assert found is not None
        low, high, coverage = found
        covered += low <= 0 <= high
    assert coverage >= 0.95
    assert abs(covered / trials - coverage) < 0.02


def test_too_few_rounds_give_no_interval() -> None:
    """Five rounds cannot hold the median with 95 % confidence, so no interval and no throughput verdict."""
    assert median_interval([1.0, 0.99, 1.01, 0.98, 1.02]) is None
    text = report(Run("cmd", 5, 48, 64, 8, "rev", "m"), [300.0] * 5, [300.0] * 5, CHEAP, 10)
    assert "- By throughput: **not resolved**; 5 rounds are too few" in text


def test_rounds_within_the_goal_are_a_met_verdict() -> None:
    """Every paired ratio at or above 0.99: met by throughput, overall met."""
    idle = [300.0, 310, 290, 305, 295, 300, 315, 285]
    text = report(RUN, [x * 0.995 for x in idle], idle, CHEAP, 100)
    assert "(with it sending, 0.99x of idle or more): **met**." in text
    assert "- By throughput: **met**;" in text


def test_rounds_all_below_the_goal_are_a_missed_verdict() -> None:
    """Every paired ratio under 0.99: missed by throughput, whatever the timed cost says."""
    idle = [300.0, 310, 290, 305, 295, 300, 315, 285]
    text = report(RUN, [x * 0.95 for x in idle], idle, CHEAP, 100)
    assert "(with it sending, 0.99x of idle or more): **missed**." in text


def test_a_spread_wider_than_the_goal_is_unresolved_and_says_what_the_run_can() -> None:
    """Ratios from 0.88 to 1.10 cannot resolve 1 %: the section says so, with the resolution, and the overall
    verdict rests on the timed cost (met when cheap, missed when not); no word about noise."""
    with_plugin = [308.0, 300, 289, 334, 278, 297, 281, 292]
    idle = [303.0, 285, 299, 334, 316, 307, 308, 265]
    cheap = report(RUN, with_plugin, idle, CHEAP, 998)
    assert "**met, by the timed cost alone**" in cheap
    assert "- By throughput: **not resolved**;" in cheap
    assert "[0.880, 1.102]" in cheap
    assert "resolves a difference of about ±11.1 %, not the goal's 1 %" in cheap
    assert "costs at most 12.0 % of vLLM's throughput" in cheap
    assert "noise" not in cheap
    assert "**missed, by the timed cost alone**" in report(RUN, with_plugin, idle, COSTLY, 998)
