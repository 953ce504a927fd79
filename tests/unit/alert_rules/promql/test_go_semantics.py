"""Go's behaviour that Prometheus inherits, checked on values whose Go answer is documented or known.

Everything here is also compared with promtool in tests/integration/test_promql_constructs.py; these
cases pin the corners (Go's text layout, calendar, regexp template rules, heap order) without promtool.
"""

from __future__ import annotations

import math

import pytest

from alert_rules.promql import Evaluator
from alert_rules.promql.dates import DATE_FIELDS, go_int64
from alert_rules.promql.gofloat import format_float
from alert_rules.promql.relabel import compile_anchored, expand
from alert_rules.promql.values import labels_of
from alert_rules.store import SeriesStore


@pytest.mark.parametrize(("value", "fmt", "text"), [
    (1e21, "f", "1000000000000000000000"), (1e-7, "f", "0.0000001"), (-2.5, "f", "-2.5"),
    (123456789.0, "g", "1.23456789e+08"), (0.000123, "g", "0.000123"), (1e-05, "g", "1e-05"),
    (100000.0, "g", "100000"), (0.8999999999999999, "E", "8.999999999999999E-01"), (0.0, "E", "0E+00"),
    (math.inf, "f", "+Inf"), (-math.inf, "g", "-Inf"), (math.nan, "E", "NaN"), (-0.0, "g", "-0"),
])
def test_go_float_text(value: float, fmt: str, text: str) -> None:
    """strconv.FormatFloat(v, fmt, -1, 64) for the layouts Prometheus uses."""
    assert format_float(value, fmt) == text  # type: ignore[arg-type]


def test_go_calendar() -> None:
    """2024-02-29T23:59:00Z is a Thursday, day 60 of a leap year; NaN becomes the smallest int64."""
    t = 1709251140
    fields = {name: f(t) for name, f in DATE_FIELDS.items()}
    assert fields == {"year": 2024, "month": 2, "day_of_month": 29, "day_of_week": 4, "day_of_year": 60,
                      "days_in_month": 29, "hour": 23, "minute": 59}
    new_year_eve = {name: f(1735603200) for name, f in DATE_FIELDS.items()}  # 2024-12-31T00:00:00Z, a Tuesday
    assert new_year_eve == {"year": 2024, "month": 12, "day_of_month": 31, "day_of_week": 2, "day_of_year": 366,
                            "days_in_month": 31, "hour": 0, "minute": 0}
    assert (DATE_FIELDS["month"](1709251200), DATE_FIELDS["day_of_month"](1709251200)) == (3, 1)  # 2024-03-01
    assert go_int64(math.nan) == go_int64(1e300) == -(1 << 63)
    assert go_int64(-2.9) == -2


@pytest.mark.parametrize(("template", "expanded"), [
    ("$1-x", "ab-x"), ("${1}x", "abx"), ("$1x", ""), ("$$1", "$1"), ("$name!", "b!"), ("${2", "${2"),
    ("$01", ""), ("$3", ""),
])
def test_regexp_expand_follows_go(template: str, expanded: str) -> None:
    """Go's Regexp.Expand: the longest name after $, braces, $$, malformed references kept as written."""
    match = compile_anchored("(a(?P<name>b))").match("ab")
    assert match is not None
    assert expand(template, match) == expanded


def test_topk_ties_keep_the_series_go_heap_keeps() -> None:
    """topk(2) of 1, 1, 1, 2 in series order: the heap drops its root, the first series, for the 2."""
    store = SeriesStore()
    for i, value in enumerate((1.0, 1.0, 1.0, 2.0)):
        store.append(labels_of({"__name__": "x", "i": str(i)}), 0, value)
    result = Evaluator(store).query("topk(2, x)", 0)
    assert isinstance(result, list)
    assert sorted(dict(labels)["i"] for labels, _ in result) == ["1", "3"]
