"""Tests of the in-memory series store."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

import pytest

from alert_rules.promql.ast import Matcher
from alert_rules.promql.values import STALE_NAN, drop_name, labels_of
from alert_rules.store import SeriesStore

A = labels_of({"__name__": "x", "m": "a"})
B = labels_of({"__name__": "x", "m": "b"})


def test_retention_trims_old_samples() -> None:
    """A series keeps no more than its retention (plus the trimming slack)."""
    store = SeriesStore(retention_ms=60_000)
    for t in range(0, 600_000, 1000):
        store.append(A, t, float(t))
    window = store.window("x", [], 0, 600_000)
    times = window[0][1]
    assert times[-1] == 599_000
    assert times[0] >= 599_000 - 60_000 * 1.125


def test_out_of_order_and_series_limit_are_dropped_and_counted() -> None:
    """Late samples and series beyond max_series are refused, never stored."""
    store = SeriesStore(max_series=1)
    assert store.append(A, 1000, 1.0)
    assert not store.append(A, 1000, 2.0)
    assert not store.append(B, 1000, 1.0)
    stats = store.stats()
    assert (stats.series, stats.samples, stats.dropped_out_of_order, stats.dropped_series_limit) == (1, 1, 1, 1)


def test_selection_is_sorted_and_matchers_apply() -> None:
    """Series come back sorted by labels; a missing label matches as the empty string."""
    import re

    store = SeriesStore()
    store.append(B, 0, 2.0)
    store.append(A, 0, 1.0)
    store.append(labels_of({"__name__": "x"}), 0, 3.0)
    assert [v for _, v in store.instant("x", [], 0, 1000)] == [3.0, 1.0, 2.0]
    regex = Matcher("m", "=~", "a|", re.compile("a|"))
    assert [v for _, v in store.instant("x", [regex], 0, 1000)] == [3.0, 1.0]


def test_gc_forgets_series_past_retention() -> None:
    """A series with no sample inside its retention is removed."""
    store = SeriesStore(retention_ms=10_000)
    store.append(A, 0, 1.0)
    store.append(B, 50_000, 1.0)
    assert store.gc(55_000) == 1
    assert len(store) == 1


def _scan_increase(times: Sequence[int], values: Sequence[float]) -> float:
    """Prometheus' reset scan over a window's samples (the reference for the bookkept resets)."""
    result = values[-1] - values[0]
    prev = values[0]
    for v in values:
        if v < prev:
            result += prev
        prev = v
    return result


def _counter(rng: random.Random, points: int) -> list[float]:
    value = 0.0
    out = []
    for _ in range(points):
        value = rng.choice([0.0, 1.5]) if rng.random() < 0.1 else value + rng.choice([0.0, 0.25, 3.0])
        out.append(value)
    return out


@pytest.mark.parametrize("backfilled", [False, True], ids=["appended one by one", "backfilled at once"])
def test_increases_match_a_scan_of_the_window(backfilled: bool) -> None:
    """Per window, the bookkept resets give the same raw increase as scanning the samples, bit for bit."""
    rng = random.Random(3)
    store = SeriesStore(retention_ms=400_000)
    values = _counter(rng, 200)
    times = [i * 5000 + rng.choice([0, 0, 0, 1200]) for i in range(200)]
    if backfilled:
        store.backfill(A, array("q", times), array("d", values))
    else:
        for t, v in zip(times, values, strict=True):
            store.append(A, t, v)
    end = times[-1]
    for mint in range(end - 450_000, end, 7_000):
        rows = store.increases("x", [], mint, end - 3_000, counter=True)
        window = store.window("x", [], mint, end - 3_000)
        if not window or len(window[0][1]) < 2:
            assert rows == []
            continue
        _, ts, vs = window[0]
        assert rows == [(drop_name(A), len(ts), ts[0], ts[-1], vs[0], _scan_increase(ts, vs))]


def test_trim_forgets_resets_that_lost_their_previous_sample() -> None:
    """After trimming, a reset is only kept while the sample it fell from is still held."""
    store = SeriesStore(retention_ms=10_000)
    for t, v in ((0, 5.0), (1000, 1.0), (2000, 2.0), (3000, 0.5)):
        store.append(A, t, v)
    store.append(A, 12_000, 1.0)
    (series,) = store.series("x", [])
    assert list(series.ts) == [2000, 3000, 12_000]
    assert list(series.reset_ts or []) == [3000]
    assert store.increases("x", [], 0, 20_000, counter=True)[0][5] == 1.0 - 2.0 + 2.0


def test_increases_leave_stale_markers_out() -> None:
    """A stale marker is skipped, so a drop across it still counts as a reset."""
    store = SeriesStore()
    for t, v in ((0, 5.0), (1000, STALE_NAN), (2000, 3.0), (3000, 4.0)):
        store.append(A, t, v)
    assert store.increases("x", [], 0, 3000, counter=True) == [(drop_name(A), 3, 0, 3000, 5.0, 4.0 - 5.0 + 5.0)]
    assert store.increases("x", [], 0, 3000, counter=False)[0][5] == -1.0


def test_label_names_sorting_before_the_metric_name_keep_the_series_findable() -> None:
    """A label like ``A`` sorts before ``__name__``; the series is still stored under its name."""
    store = SeriesStore()
    store.append(labels_of({"__name__": "x", "A": "1"}), 0, 1.0)
    assert [v for _, v in store.instant("x", [], 0, 1000)] == [1.0]


def test_remembered_selections_see_new_series() -> None:
    """A selector's cached match list is refreshed when a matching series appears."""
    store = SeriesStore()
    matcher = Matcher("m", "=", "b")
    store.append(A, 0, 1.0)
    assert store.instant("x", [matcher], 0, 1000) == []
    store.append(B, 0, 2.0)
    assert store.instant("x", [matcher], 0, 1000) == [(B, 2.0)]
