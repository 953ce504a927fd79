"""Tests of instant evaluation; reference numbers were produced by promtool 2.42 on the same series."""

from __future__ import annotations

import math

import pytest

from alert_rules.promql import EvaluationError, Evaluator
from alert_rules.promql.values import STALE_NAN, labels_of
from alert_rules.store import SeriesStore

MIN = 60_000


def store_with(series: dict[str, list[float | None]], step_ms: int = MIN) -> SeriesStore:
    """A store holding each series (text like ``x{a="b"}``) at 0, step, 2*step, ..."""
    from alert_rules.promtool_runner import parse_labels

    store = SeriesStore()
    for text, values in series.items():
        for i, value in enumerate(values):
            if value is not None:
                store.append(parse_labels(text), i * step_ms, value)
    return store


def q(store: SeriesStore, expr: str, t_ms: int) -> object:
    """Evaluate with labels shown as dicts."""
    value = Evaluator(store).query(expr, t_ms)
    if isinstance(value, float):
        return value
    return [(dict(labels), v) for labels, v in value]


def test_rate_and_deriv_match_promtool() -> None:
    """rate() extrapolation and deriv() regression give promtool's exact floats."""
    store = store_with({"y": [0, 1, 3, 7, 15, 31, 63, 127]})
    assert q(store, "rate(y[5m])", 7 * MIN + 30_000) == [({}, 0.4733333333333334)]
    assert q(store, "deriv(y[10m])", 7 * MIN) == [({}, 0.25615079365079363)]


def test_rate_handles_counter_resets_and_closed_left_edge() -> None:
    """Counter resets are added back; a sample exactly at t-range is inside the window (2.x)."""
    store = store_with({"c": [0, 10, 25, 25, 40, 5, 15]})
    assert q(store, "rate(c[3m])", 4 * MIN + 30_000) == [({}, 0.125)]
    assert q(store, "increase(c[3m])", 4 * MIN + 30_000) == [({}, 22.5)]
    assert q(store, "increase(c[3m])", 6 * MIN) == [({}, 30.0)]
    assert q(store, "rate(c[1m])", 2 * MIN) == [({}, 0.25)]


def test_over_time_sums_are_compensated_like_promtool() -> None:
    """sum_over_time and avg_over_time use Kahan summation (promtool: 1.2 and 0.48333...)."""
    store = store_with({"x": [0.1, 1e16, 0.3, -1e16, 0.7, 0.1]})
    assert q(store, "sum_over_time(x[10m])", 5 * MIN) == [({}, 1.2)]
    assert q(store, "avg_over_time(x[10m])", 5 * MIN) == [({}, 0.4833333333333333)]


def test_avg_aggregation_avoids_overflow() -> None:
    """avg divides before adding, as 2.42 does: avg(1e308, -1e308) is 0 and sum overflows to +Inf."""
    store = store_with({'x{i="a"}': [1e308], 'x{i="b"}': [-1e308], 'y{i="a"}': [1e308],
                        'y{i="b"}': [1e308]})
    assert q(store, "avg(x)", 0) == [({}, 0.0)]
    assert q(store, "avg(y)", 0) == [({}, 1e308)]
    assert q(store, "sum(y)", 0) == [({}, math.inf)]


def test_lookback_and_staleness() -> None:
    """A sample is visible for exactly 5 minutes, and a stale marker hides it at once."""
    store = store_with({"x": [None, 1.0], "s": [1.0, 2.0, STALE_NAN]})
    assert q(store, "x", 6 * MIN) == [({"__name__": "x"}, 1.0)]
    assert q(store, "x", 6 * MIN + 1000) == []
    assert q(store, "s", 2 * MIN) == []
    assert q(store, "s", MIN + 30_000) == [({"__name__": "s"}, 2.0)]


def test_histogram_quantile_edges() -> None:
    """Interpolation inside a bucket, the +Inf bucket giving the top finite bound, all-zero NaN."""
    store = SeriesStore()
    for le, count in (("0.5", 10.0), ("1.0", 20.0), ("2.5", 30.0), ("+Inf", 40.0)):
        store.append(labels_of({"__name__": "h_bucket", "le": le, "m": "a"}), 0, count)
        store.append(labels_of({"__name__": "z_bucket", "le": le}), 0, 0.0)
    assert q(store, "histogram_quantile(0.5, h_bucket)", 0) == [({"m": "a"}, 1.0)]
    assert q(store, "histogram_quantile(0.3, h_bucket)", 0) == [({"m": "a"}, 0.5 + 0.5 * 0.2)]
    assert q(store, "histogram_quantile(0.99, h_bucket)", 0) == [({"m": "a"}, 2.5)]
    [(labels, value)] = q(store, "histogram_quantile(0.5, z_bucket)", 0)  # type: ignore[misc]
    assert labels == {}
    assert math.isnan(value)


def test_vector_matching_and_set_operators() -> None:
    """on/ignoring, group_left, and/or/unless and bool follow Prometheus' label rules."""
    store = store_with({'e{m="a", k="x"}': [1.0], 'e{m="b", k="x"}': [4.0], 't{m="a"}': [10.0],
                        't{m="b"}': [8.0]})
    assert q(store, "e / on (m) t", 0) == [({"m": "a"}, 0.1), ({"m": "b"}, 0.5)]
    assert q(store, "e / ignoring (k) group_left t", 0) == [({"k": "x", "m": "a"}, 0.1),
                                                             ({"k": "x", "m": "b"}, 0.5)]
    assert q(store, "e > 2", 0) == [({"__name__": "e", "k": "x", "m": "b"}, 4.0)]
    assert q(store, "e > bool 2", 0) == [({"k": "x", "m": "a"}, 0.0), ({"k": "x", "m": "b"}, 1.0)]
    assert q(store, "t and on (m) (e > 2)", 0) == [({"__name__": "t", "m": "b"}, 8.0)]
    assert q(store, "t unless on (m) (e > 2)", 0) == [({"__name__": "t", "m": "a"}, 10.0)]
    assert q(store, "vector(1) or vector(2)", 0) == [({}, 1.0)]
    assert q(store, "2 < bool 3", 0) == 1.0


def test_many_to_many_without_group_modifier_fails() -> None:
    """Duplicate match groups raise the error Prometheus raises."""
    store = store_with({'e{m="a", k="x"}': [1.0], 'e{m="a", k="y"}': [2.0], 't{m="a"}': [1.0]})
    with pytest.raises(EvaluationError):
        Evaluator(store).query("t / on (m) e", 0)


def test_aggregations_group_by_and_without() -> None:
    """by keeps only the named labels, without drops them and the name; groups keep first-seen order."""
    store = store_with({'x{a="1", b="p"}': [1.0], 'x{a="1", b="q"}': [3.0], 'x{a="2", b="p"}': [5.0]})
    assert q(store, "sum by (a) (x)", 0) == [({"a": "1"}, 4.0), ({"a": "2"}, 5.0)]
    assert q(store, "max without (b) (x)", 0) == [({"a": "1"}, 3.0), ({"a": "2"}, 5.0)]
    assert q(store, "count(x)", 0) == [({}, 3.0)]
    assert q(store, "quantile(0.5, x)", 0) == [({}, 3.0)]


def test_absent_takes_labels_from_equality_matchers() -> None:
    """absent() of a missing selector returns 1 with its equality labels."""
    store = SeriesStore()
    assert q(store, 'absent(up{job="vllm", i=~"x"})', 0) == [({"job": "vllm"}, 1.0)]


def test_topk_and_bottomk_keep_labels_and_the_earlier_input_on_a_tie() -> None:
    """topk/bottomk as Prometheus 2.42: input labels kept, per group, best first; a tie keeps the earlier input."""
    from alert_rules.promql.evaluate import Evaluator as _Evaluator
    from alert_rules.promql.values import labels_of as _labels_of
    from alert_rules.store import SeriesStore as _Store

    store = _Store()
    for bucket, value in (("a", 1.0), ("b", 3.0), ("c", 3.0), ("d", 0.5)):
        store.append(_labels_of({"__name__": "x", "b": bucket, "g": "1" if bucket in "ab" else "2"}), 0, value)
    ev = _Evaluator(store)
    assert ev.query("topk(1, sum by (b) (x))", 1000) == [((("b", "b"),), 3.0)]
    assert [dict(k)["b"] for k, _ in ev.query("topk by (g) (1, x)", 1000)] == ["b", "c"]
    assert [dict(k)["b"] for k, _ in ev.query("bottomk(2, x)", 1000)] == ["d", "a"]
    assert ev.query("topk(1, x > 5)", 1000) == []
    assert ev.query("topk(0, x)", 1000) == []
