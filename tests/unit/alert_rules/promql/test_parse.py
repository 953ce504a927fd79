"""Tests of the supported-subset check."""

from __future__ import annotations

import pytest

from alert_rules.promql import UnsupportedExpression, check_supported
from alert_rules.promql.ast import Aggregate, Binary
from alert_rules.promql.parse import parse_expr


@pytest.mark.parametrize("expr", [
    'sum by (model_name) (rate(inferwatch_requests_total{outcome!="ok"}[5m])) '
    "/ sum by (model_name) (rate(inferwatch_requests_total[5m])) > 0.01",
    'histogram_quantile(0.99, sum by (le) (rate(x_bucket{le=~".+"}[5m])))',
    "a and on (model_name) b or c unless ignoring (x) d",
    "a / ignoring (x) group_left (y) b",
    "deriv(m[1h]) * 3600 / m > 0.05",
    "quantile_over_time(0.75, vllm:num_requests_running[1h]) < bool 256",
    "absent(up{job=\"vllm\"}) or vector(0) * time()",
    "-x offset 5m",
    'count_values("v", x)',
    'sum(rate(x[5m])) + label_replace(y, "a", "$1", "c", "(.*)")',
    "max_over_time(x[5m:1m]) + rate(x[5m] @ start()) - stddev(x @ 100 offset 1m)",
    "day_of_week() + round(x, 0.5) - timestamp(x) + sort(sgn(x))",
])
def test_supported_expressions_pass(expr: str) -> None:
    """Every construct of the subset is accepted."""
    check_supported(expr)


@pytest.mark.parametrize(("expr", "construct", "offset"), [
    ("count_values(\"a-b\", x)", "aggregation count_values", 0),
    ("sum(rate(x[5m])) + label_replace(y, \"a-b\", \"b\", \"c\", \"d\")", "function label_replace()", 19),
    ("sum(x) + label_replace(y, \"a\", \"b\", \"c\", \"(\")", "function label_replace()", 9),
    ("x @ -100", "@ modifier", 2),
    ("max_over_time((x @ 10)[5m:1m] @ 100)", "@ modifier", 17),
    ("sort_by_label(x, \"a\")", "function sort_by_label()", 0),
    ("rate(x[5m]", "syntax", None),
])
def test_unsupported_expressions_name_construct_and_position(expr: str, construct: str,
                                                             offset: int | None) -> None:
    """A refused expression names the construct and where it is."""
    with pytest.raises(UnsupportedExpression) as info:
        check_supported(expr)
    assert info.value.construct == construct
    assert info.value.position == offset
    assert construct in str(info.value)
    assert isinstance(info.value, ValueError)


def test_modifiers_are_kept() -> None:
    """Grouping, bool and matching modifiers reach the evaluator's tree."""
    node = parse_expr("sum without (a) (x) > bool on (b) y")
    assert isinstance(node, Binary)
    assert node.return_bool
    assert node.on
    assert node.matching == ("b",)
    assert isinstance(node.lhs, Aggregate)
    assert node.lhs.without
    assert node.lhs.grouping == ("a",)
