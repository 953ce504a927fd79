"""The soak's account of what grows with time: the rule store's bound per series and RSS before and after it."""

from __future__ import annotations

from collections import Counter

import pytest

from alert_rules.store import SeriesStore
from benchmarks import soak
from benchmarks.soak import Reading, Result, Snapshot, StoreConfig, Tally, memory_goal, samples_bound, store_lines

MIB = 2**20


@pytest.mark.parametrize(("retention_s", "interval_s"), [(60, 1), (60, 7), (3 * 3600, 15)])
def test_the_bound_per_series_is_what_the_real_store_holds_at_most(retention_s: int, interval_s: int) -> None:
    """A series fed one sample per interval for three retentions never holds more than the bound, and reaches it."""
    store = SeriesStore(retention_ms=retention_s * 1000)
    most = 0
    for i in range(3 * retention_s // interval_s):
        store.append({"__name__": "x"}, i * interval_s * 1000, float(i))
        most = max(most, store.stats().samples)
    assert most == samples_bound(retention_s, interval_s)


def _snapshot(when: str, rss_mib: float) -> Snapshot:
    return Snapshot(when, 0, 3, 15, 1, int(rss_mib * MIB), 3, 5000, True)


def _result(readings: list[Reading], end_rss_mib: float) -> Result:
    snapshots = [_snapshot("start", 50), _snapshot("first", 60), _snapshot("warm", 70), _snapshot("end", end_rss_mib)]
    return Result(Tally(None, sent=10), snapshots, soak.Records(10, {}, {}, {}, 10), 0, Counter(), [], 100.0, readings,
                  warm_s=10.0, store=StoreConfig(60, 1), sample_every_s=5)


def _filling_then_flat(until_s: int) -> list[Reading]:
    """RSS rising 1 MiB every 5 s until the store is full (78.5 s: 10 + 60 x 1.125 + 1), flat after."""
    return [Reading(t, t * 10, int((70 + min(t, 75) / 5) * MIB), 5000) for t in range(10, until_s, 5)]


def test_a_run_past_the_fill_is_judged_on_its_plateau_and_states_the_steady_state() -> None:
    """Past the fill the goal compares the plateau's ends (flat here, though RSS grew 11 MiB while filling),
    and the section gives the slope before and after and the steady-state RSS."""
    result = _result(_filling_then_flat(300), end_rss_mib=86)
    text, met = memory_goal(result)
    assert met
    assert text.startswith("resident memory flat once the rule engine's store has filled (from 78 s on")
    assert "+0.00% (85.0 MiB -> 85.0 MiB" in text
    lines = "\n".join(store_lines(result))
    assert "Slope while it filled: +12.00 MiB/min" in lines
    assert "after: +0.00 MiB/min" in lines
    assert "Steady state: RSS 85.0 MiB" in lines


def test_growth_on_the_plateau_misses_the_goal() -> None:
    """RSS still climbing 1 MiB every 5 s after the fill: the plateau's ends differ by more than 5 %."""
    readings = [Reading(t, t * 10, int((70 + t / 5) * MIB), 5000) for t in range(10, 300, 5)]
    _, met = memory_goal(_result(readings, end_rss_mib=130))
    assert not met


def test_a_run_shorter_than_the_fill_claims_no_steady_state() -> None:
    """Ended at 60 s, before the store could be full: the goal falls back to warm-up -> end and says why,
    and the section states no steady state."""
    result = _result(_filling_then_flat(60), end_rss_mib=72)
    text, _ = memory_goal(result)
    assert "the run ended before the rule engine's store could fill (78 s after the sidecar was ready)" in text
    lines = "\n".join(store_lines(result))
    assert "Steady state" not in lines
    assert "it does not show the steady state" in lines
