"""Randomized differential tests: the embedded evaluator against the real promtool 2.42.

Hypothesis draws series (counters with resets, gauges with gaps and stale markers, classic
histograms) and expressions from the supported subset. Our evaluator computes each result;
the results become a promtool ``promql_expr_test`` file, and ``promtool test rules`` must pass
it. Values are kept on a 1/4 grid and sums/averages only run over raw gauges of 1, 2 or 4
series, so the results do not depend on promtool's (random) series order.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alert_rules.promql import Evaluator
from alert_rules.promtool_runner import load_series, parse_labels
from alert_rules.store import SeriesStore

pytestmark = pytest.mark.real_server
STEP_MS = 60_000
POINTS = 16

# avg is taken per j (at most two series a group): over three series its incremental mean depends on
# the order series are visited, which is Prometheus' creation order and our label order.
TEMPLATES = [
    "rate(c[R])", "increase(c[R])", "irate(c[R])", "resets(c[R])", "delta(g[R])", "idelta(g[R])",
    "deriv(g[R])", "predict_linear(g[R], 600)", "avg_over_time(g[R])", "sum_over_time(g[R])",
    "max_over_time(g[R])", "min_over_time(g[R])", "count_over_time(g[R])", "last_over_time(g[R])",
    "quantile_over_time(Q, g[R])", "changes(g[R])", "histogram_quantile(Q, h_bucket)",
    "histogram_quantile(Q, rate(h_bucket[R]))", "sum by (i) (g)", "avg by (j) (g)", "max(rate(c[R]))",
    "min by (j) (g)", "count without (i) (g)", "quantile(Q, g)", "group by (j) (g)",
    "g > bool 0", "g < 1", "-g", "g * 2 + 1", "g / g", "g % 3", "g ^ 2", "c / on (i, j) g",
    "g and on (i) (c > 3)", "g or c", "g unless on (i) c", "clamp_max(g, 1)", "clamp_min(g, -1)",
    "abs(g)", 'absent(nothing{a="b"})', "vector(1) + scalar(sum(g))", "time() - 60", "g offset 1m",
    "1 - g <= bool 0.5", "max(g) by (j) - on (j) min(g) by (j)", "rate(c[R]) > 0.01 and on (i) g >= 0",
]


@st.composite
def series_sets(draw: st.DrawFn) -> list[dict[str, str]]:
    """Input series in promtool notation: counters, gauges and one or two histograms."""
    count = draw(st.sampled_from([1, 2, 4]))
    out = []
    for n in range(count):
        labels = f'i="{n}", j="{n % 2}"'
        value = draw(st.integers(0, 20))
        counter = []
        gauge = []
        for _ in range(POINTS):
            if draw(st.integers(0, 9)) == 0:
                value = draw(st.integers(0, 3))
            else:
                value += draw(st.integers(0, 6))
            counter.append("_" if draw(st.integers(0, 5)) == 0 else str(value))
            roll = draw(st.integers(0, 19))
            gauge.append("_" if roll == 0 else "stale" if roll == 1 else str(draw(st.integers(-32, 32)) / 4))
        out.append({"series": f"c{{{labels}}}", "values": " ".join(counter)})
        out.append({"series": f"g{{{labels}}}", "values": " ".join(gauge)})
    for h in range(draw(st.integers(1, 2))):
        totals = [0, 0, 0, 0]
        rows: list[list[str]] = [[], [], [], []]
        for _ in range(POINTS):
            adds = [draw(st.integers(0, 4)) for _ in range(4)]
            running = 0
            for k in range(4):
                running += adds[k]
                totals[k] += running
                rows[k].append(str(totals[k]))
        for k, le in enumerate(("0.5", "1.0", "2.5", "+Inf")):
            out.append({"series": f'h_bucket{{le="{le}", m="{h}"}}', "values": " ".join(rows[k])})
    return out


def _expressions(draw: st.DrawFn) -> list[str]:
    picked = draw(st.lists(st.sampled_from(TEMPLATES), min_size=6, max_size=12, unique=True))
    exprs = []
    for template in picked:
        text = template.replace("R", draw(st.sampled_from(["1m", "2m", "3m", "5m", "150s"])))
        exprs.append(text.replace("Q", draw(st.sampled_from(["0", "0.25", "0.5", "0.9", "1"]))))
    return exprs


def _yaml_value(value: float) -> float | str:
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return value


def _promql_case(evaluator: Evaluator, expr: str, at_ms: int) -> dict[str, object]:
    result = evaluator.query(expr, at_ms)
    samples = [((), result)] if isinstance(result, float) else result
    if any(math.isnan(v) for _, v in samples):
        expr = f"({expr}) == ({expr})"  # NaN can't be asserted: keep the non-NaN part (promtool §6.3)
        result = evaluator.query(expr, at_ms)
        samples = [((), result)] if isinstance(result, float) else result
    return {
        "expr": expr,
        "eval_time": f"{at_ms // 1000}s",
        "exp_samples": [
            {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}",
             "value": _yaml_value(value)}
            for labels, value in samples if not math.isnan(value)
        ],
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_evaluator_agrees_with_promtool(promtool: Path, data: st.DataObject) -> None:
    """Every expression evaluated by us at random times gives exactly promtool's result."""
    series = data.draw(series_sets())
    exprs = _expressions(data.draw)
    store = SeriesStore(retention_ms=10**12)
    load_series(store, series, STEP_MS)
    evaluator = Evaluator(store)
    cases = []
    for expr in exprs:
        at_ms = data.draw(st.integers(0, (POINTS + 6) * 60)) * 1000
        cases.append(_promql_case(evaluator, expr, at_ms))
    doc = {"rule_files": [], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "parity.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False).replace("'.inf'", ".inf").replace("'-.inf'", "-.inf"))
        proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True,
                              timeout=60, check=False)
    assert proc.returncode == 0, f"promtool disagrees with the evaluator:\n{proc.stdout}{proc.stderr}"


def test_labels_parser_round_trip() -> None:
    """The label text written into parity files parses back to the same label set."""
    assert parse_labels('{i="0", j="1"}') == (("i", "0"), ("j", "1"))
