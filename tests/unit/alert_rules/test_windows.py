"""Burn-rate windows: factors derived from budget shares, thresholds computed one way (alerting.md §8)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from alert_rules.windows import PAGE_FAST, PAGE_SLOW, TICKET, budget, detection_time_s, threshold, windows_used


def test_factors_are_the_workbook_numbers_for_30_days() -> None:
    """2 % in 1h, 5 % in 6h and 10 % in 3d give 14.4, 6 and 1 for a 30-day period."""
    assert [p.factor(30) for p in (PAGE_FAST, PAGE_SLOW, TICKET)] == [Decimal("14.4"), 6, 1]


def test_factors_scale_with_the_period() -> None:
    """A 28-day period gives Sloth's 13.44 for the fast page."""
    assert PAGE_FAST.factor(28) == Decimal("13.44")


def test_thresholds_have_no_float_noise() -> None:
    """14.4 x (1 - 0.999) is 0.0144 exactly, not 0.014400000000000001 (pitfall 9)."""
    assert threshold(PAGE_FAST, 0.999, 30) == 0.0144
    assert threshold(PAGE_SLOW, 0.999, 30) == 0.006
    assert threshold(TICKET, 0.999, 30) == 0.001
    assert budget(0.999) == Decimal("0.001")


@pytest.mark.parametrize(
    ("pair", "error", "seconds"),
    [(PAGE_FAST, 1.0, 51.84), (PAGE_FAST, 0.1, 518.4), (PAGE_SLOW, 1.0, 129.6), (PAGE_SLOW, 0.1, 1296.0),
     (PAGE_SLOW, 0.0144, 9000.0), (TICKET, 0.005, 51840.0), (PAGE_FAST, 0.0144, None), (PAGE_FAST, 0.005, None)],
    ids=["fast page at 100 %", "fast page at 10 %", "slow page at 100 %", "slow page at 10 %",
         "slow page at 1.44 %", "ticket at 0.5 %", "boundary never fires", "0.5 % never pages fast"],
)
def test_detection_times_match_the_workbook_table(pair: object, error: float, seconds: float | None) -> None:
    """Detection times reproduce alerting.md §8.4 for a 99.9 % SLO over 30 days."""
    got = detection_time_s(pair, 0.999, 30, error)  # type: ignore[arg-type]
    assert got == (pytest.approx(seconds) if seconds is not None else None)


def test_windows_used_are_sorted_and_unique() -> None:
    """The ratio recordings needed: 5m, 30m, 1h, 6h and 3d."""
    assert windows_used() == (300, 1800, 3600, 21600, 259200)
