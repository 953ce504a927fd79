"""Tests of the promtool-format test runner and the series notation."""

from __future__ import annotations

import math
from pathlib import Path

from alert_rules.promql.gofloat import format_float
from alert_rules.promql.values import is_stale
from alert_rules.promtool_runner import parse_labels, parse_values, run_files

RULES = """
groups:
  - name: g
    rules:
      - alert: Up
        expr: x > 0
        for: 1m
        labels: {severity: ticket}
        annotations: {summary: "x is {{ $value }}"}
"""
TEST = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'x{i="a"}', values: '0 1 2 0'}
    alert_rule_test:
      - {eval_time: 1m, alertname: Up, exp_alerts: []}
      - eval_time: 2m30s
        alertname: Up
        exp_alerts:
          - exp_labels: {i: a, severity: ticket}
            exp_annotations: {summary: "x is 2"}
    promql_expr_test:
      - expr: x * 2
        eval_time: 2m
        exp_samples: [{labels: '{i="a"}', value: 4}]
"""


def test_expanding_notation() -> None:
    """a+bxn gives n+1 values by repeated addition; _xn gives n gaps; stale is the stale marker."""
    values = parse_values("-2+4x3 1x2 _x2 0.1+0.1x2 stale _")
    assert values[:9] == [-2.0, 2.0, 6.0, 10.0, 1.0, 1.0, 1.0, None, None]
    assert values[9:12] == [0.1, 0.2, 0.30000000000000004]
    assert is_stale(values[12])  # type: ignore[arg-type]
    assert values[13] is None


def test_labels_and_value_printing() -> None:
    """Series descriptions parse to label sets; values print like Go's %E."""
    assert parse_labels('x{a="b", c="d\\"e"}') == (("__name__", "x"), ("a", "b"), ("c", 'd"e'))
    assert parse_labels("{}") == ()
    assert format_float(0.8999999999999999, "E") == "8.999999999999999E-01"
    assert format_float(1e308, "E") == "1E+308"
    assert format_float(math.inf, "E") == "+Inf"


def test_passing_file(tmp_path: Path) -> None:
    """A correct test file passes, an off-by-one expectation fails with a promtool-like report."""
    (tmp_path / "rules.yml").write_text(RULES)
    good = tmp_path / "good.yml"
    good.write_text(TEST)
    bad = tmp_path / "bad.yml"
    bad.write_text(TEST.replace("value: 4", "value: 5"))
    results, report = run_files([good, bad])
    assert [r.ok for r in results] == [True, False]
    assert "SUCCESS" in report
    assert 'expr: "x * 2", time: 2m,' in report
    assert "got: {i=\"a\"} 4E+00" in report


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    """Like promtool, an unknown key fails the file."""
    (tmp_path / "rules.yml").write_text(RULES)
    path = tmp_path / "t.yml"
    path.write_text(TEST.replace("evaluation_interval: 1m", "evaluation_interval: 1m\nexternal_labels: {}"))
    [result], _ = run_files([path])
    assert not result.ok
    assert result.errors
