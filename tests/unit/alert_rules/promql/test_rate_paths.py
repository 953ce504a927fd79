"""rate/increase/delta from the store's bookkept resets equal the scan of the window's samples, bit for bit."""

from __future__ import annotations

import math
import struct
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from alert_rules.promql import Evaluator
from alert_rules.promql import functions as fn
from alert_rules.promql.values import STALE_NAN, labels_of
from alert_rules.store import SeriesStore

X = labels_of({"__name__": "x", "i": "0"})


def bits(value: float) -> int:
    """The float's exact bit pattern (so NaN and -0.0 compare exactly)."""
    return struct.unpack("<Q", struct.pack("<d", value))[0]


values = st.one_of(
    st.integers(0, 40).map(float),
    st.sampled_from([0.25, 1e16, -3.0, -0.0, math.nan, STALE_NAN, math.inf]),
)


@settings(max_examples=150, deadline=None)
@given(
    points=st.lists(st.tuples(st.integers(1, 9_000), values), min_size=1, max_size=40),
    retention_s=st.integers(20, 400),
    range_s=st.integers(1, 200),
    at_s=st.integers(0, 400),
    backfilled=st.booleans(),
)
def test_fast_path_equals_window_scan(points: list[tuple[int, float]], retention_s: int, range_s: int,
                                      at_s: int, backfilled: bool) -> None:
    """For counters with resets, NaN, stale markers, gaps and trimming, every rate-like function agrees."""
    store = SeriesStore(retention_ms=retention_s * 1000)
    t = 0
    samples = []
    for gap, value in points:
        t += gap
        samples.append((t, value))
    if backfilled:
        store.backfill(X, array("q", [t for t, _ in samples]), array("d", [v for _, v in samples]))
    else:
        for t, value in samples:
            store.append(X, t, value)
    at = at_s * 1000
    evaluator = Evaluator(store)
    for func in ("rate", "increase", "delta"):
        got = evaluator.query(f"{func}(x[{range_s}s])", at)
        window = store.window("x", [], at - range_s * 1000, at)
        expected = []
        for _labels, ts, vs in window:
            value = fn.extrapolated_rate(ts, vs, at - range_s * 1000, at, range_s * 1000, func != "delta",
                                         func == "rate")
            if value is not None:
                expected.append(value)
        assert [bits(v) for _, v in got] == [bits(v) for v in expected], func
