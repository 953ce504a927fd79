"""Tests of the in-memory series store."""

from __future__ import annotations

from alert_rules.promql.ast import Matcher
from alert_rules.promql.values import labels_of
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
