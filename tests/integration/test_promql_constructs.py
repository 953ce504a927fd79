"""Construct by construct, the embedded evaluator against real promtool 2.42, compared to the last bit.

Hypothesis draws series (arbitrary floats, NaN and infinities, counters with resets, classic histograms
with fractional counts) and, for every construct a Prometheus 2.42 rule may hold, expressions using it.
Our evaluator computes each result; all of them become ``promql_expr_test`` cases of one promtool file
(many test groups, one ``promtool test rules`` run per example), and promtool must pass every case:
it compares the floats exactly.

Exact comparisons of sums and means need one order of the series on both sides. promtool creates a
series when it loads its first sample, and its head returns series in creation order; so the k-th
series of a family (by label set, the embedded store's order) gets its first sample at step k, which
makes promtool's order the store's. Inside a subquery Prometheus orders the results of operators by a
hash, so templates there aggregate selectors and functions only.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from alert_rules.promql import Evaluator
from alert_rules.promql.errors import EvaluationError
from alert_rules.promql.values import Labels
from alert_rules.promtool_runner import load_series
from alert_rules.store import SeriesStore

pytestmark = pytest.mark.real_server
STEP_S = 60
POINTS = 14
LAST_S = (POINTS + 4) * STEP_S
"""The last evaluation time: every case's @ time stays at or before it (promtool loads no later sample)."""

# Placeholders: R a range, S a subquery step, Q a quantile, K a k, T an @ time in seconds, N a number.
CONSTRUCTS: dict[str, list[str]] = {
    "round": ["round(g)", "round(g, N)", "round(c, 0.1)", "round(-g, 3)"],
    "stddev/stdvar": ["stddev(g)", "stdvar(g)", "stddev by (j) (g)", "stdvar without (i) (c)"],
    "count_values": ['count_values("v", g)', 'count_values by (j) ("v", round(g))',
                     'count_values without (i) ("j", g * N)', 'count_values("i", c)'],
    "topk/bottomk": ["topk(K, g)", "bottomk(K, g)", "topk by (j) (K, round(g))", "bottomk without (i) (K, c % 3)",
                     "topk(N, g)"],
    "label_replace/label_join": [
        'label_replace(g, "dst", "$1-x", "i", "(.*)")', 'label_replace(g, "j", "v${1}w", "i", "([0-2])")',
        'label_replace(c, "i", "$1x$$", "j", "(.)")', 'label_replace(g, "k", "$name", "i", "(?P<name>[13])")',
        'label_join(g, "dst", "-", "i", "j", "nothing")', 'label_join(c, "i", "", "nothing")',
    ],
    "subquery": ["max_over_time(g[R:S])", "avg_over_time(rate(c[2m])[R:S])", "rate(c[R:S])",
                 "sum_over_time(sum(g)[R:])", "deriv(g[R:S] offset 1m)", "quantile_over_time(Q, g[R:S])",
                 "min_over_time((g > 0)[R:S])", "last_over_time(g[R:S])", "count_over_time(c[R:S])",
                 "delta(max(g)[R:S])", "max_over_time(avg_over_time(g[2m])[R:S])",
                 "min_over_time(max_over_time(g[2m:S])[R:S])", "max_over_time(g[R:S] offset -1m)",
                 "timestamp(last_over_time(g[R:S]))"],
    "@": ["g @ T", "rate(c[R] @ T)", "sum(g @ start())", "g @ end() offset 1m", "max_over_time(g[R:S] @ T)",
          "max_over_time((g @ T)[R:S])", "sum_over_time(g[R:S] @ T offset 1m)", "increase(c[R] @ T offset 2m)",
          "avg(g @ T) - avg(g)", "rate(c[R:S] @ T offset 1m)", "sum_over_time((g @ end())[R:S])",
          "last_over_time(g[R] @ T)", "g offset -1m", "max_over_time((g @ start())[R:S] offset 2m)",
          "-g @ T + g @ T", "sum_over_time(sum_over_time(max_over_time(c[1m])[R:S] @ T)[3m:1m])",
          "sum_over_time(sum_over_time(last_over_time(c[1m])[2m:S] offset 1m)[R:S] @ T)",
          "sum_over_time(minute(c @ T * 60)[R:S])", "sum_over_time(minute()[R:S] @ T offset 1m)",
          "sum_over_time(timestamp(timestamp(c @ T))[R:S])",
          "sum_over_time(vector(time())[R:S] @ T)", "timestamp(timestamp(g @ T))"],
    "date functions": ["day_of_month(c * 86400 * 29 + g * 1e6)", "day_of_week(c * 86400)",
                       "day_of_year(c * 86400 * 17 - g * 1e7)", "days_in_month(c * 2.3e6)", "hour(g * 1e5)",
                       "minute(c * 97)", "month(g * 1e7)", "year(c * 3.1e8 - g * 1e9)",
                       "day_of_month()", "day_of_week()", "day_of_year()", "days_in_month()", "hour()",
                       "minute()", "month()", "year()", "year(vector(time() * 1e5))"],
    "timestamp": ["timestamp(g)", "timestamp(g offset 1m)", "timestamp(sum(g))", "timestamp(g @ T offset 1m)",
                  "timestamp(c @ T)"],
    "predict_linear with @": ["predict_linear(g[R] @ T, 300)", "predict_linear(c[R] @ start(), N)",
                              "predict_linear(g[R:S] @ T, 600)"],
    "avg": ["avg(g)", "avg by (j) (g)", "avg(c / 7)", "avg without (i) (g * 0.1)"],
    "histogram_quantile": ["histogram_quantile(Q, h_bucket)", "histogram_quantile(Q, sum by (le) (h_bucket))",
                           "histogram_quantile(Q, rate(h_bucket[R]))",
                           "histogram_quantile(Q, sum by (le) (rate(h_bucket[R])))",
                           'histogram_quantile(Q, sum by (le) (label_replace(label_replace(g, "le", "$1", "i", '
                           '"([0-2])"), "le", "+Inf", "i", "3")))'],
    "absent": ['absent(nothing{a="1", a="2"})', 'absent(nothing{a="1", a!="2"})', 'absent(nothing{a=~"x", b="y"})',
               'absent(g{i="0", i="1"})', 'absent(nothing{a="", b="z"})', 'absent_over_time(nothing{a="1", a="1"}[R])'],
    "math": ["sgn(g)", "deg(g)", "rad(g)", "pi() * g", "sin(g)", "cos(g)", "tan(g)", "asin(g / 8)",
             "acos(g / 8)", "atan(g)", "sinh(g)", "cosh(g)", "tanh(g)", "asinh(g)", "acosh(g + 9)",
             "atanh(g / 9)", "ln(c)", "log2(c)", "log10(c)", "exp(g)", "sqrt(c)", "abs(g) ^ 0.5",
             "g atan2 c", "g ^ 3", "abs(g) ^ 1.7", "c ^ -2", "g ^ N", "exp(g * 20)", "ln(c * 1e-300)"],
    "over_time": ["stddev_over_time(g[R])", "stdvar_over_time(c[R])", "sum_over_time(g[R])",
                  "avg_over_time(g[R])", "quantile_over_time(Q, g[R])"],
    "sort": ["sort(g)", "sort_desc(c)"],
    "aggregation": ["sum(g)", "sum by (j) (g)", "quantile(Q, g)", "count(g)", "min(g)", "max by (j) (g)",
                    "group(c)"],
    "native histogram functions": ["histogram_count(g)", "histogram_sum(c)", "histogram_fraction(0, 1, g)"],
}


@st.composite
def _value(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.sampled_from(["NaN", "Inf", "-Inf", "_", "stale"]))
    if kind < 6:
        return str(draw(st.integers(-8, 8)) / 2)
    return repr(draw(st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=64)))


@st.composite
def series_sets(draw: st.DrawFn) -> list[dict[str, str]]:
    """Gauges g, counters c and histograms h_bucket; the k-th series of a family starts at step k."""
    count = draw(st.integers(1, 4))
    out = []
    for n in range(count):
        labels = f'i="{n}", j="{n % 2}"'
        value = draw(st.floats(0, 50, width=32))
        counter = []
        for _ in range(POINTS - n):
            if draw(st.integers(0, 9)) == 0:
                value = draw(st.floats(0, 3, width=32))
            else:
                value += draw(st.floats(0, 7, width=32))
            counter.append(repr(float(value)))
        gauge = [repr(draw(st.floats(-10, 10, width=32)))] + [draw(_value()) for _ in range(POINTS - n - 1)]
        out.append({"series": f"c{{{labels}}}", "values": " ".join(["_"] * n + counter)})
        out.append({"series": f"g{{{labels}}}", "values": " ".join(["_"] * n + gauge)})
    buckets = []
    for m in range(draw(st.integers(1, 2))):
        totals = [0.0] * 4
        rows: list[list[str]] = [[], [], [], []]
        for _ in range(POINTS):
            running = 0.0
            for k in range(4):
                running += draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.25]))
                totals[k] += running
                rows[k].append(repr(totals[k]))
        for k, le in enumerate(("0.25", "1.0", "2.5", "+Inf")):
            buckets.append(((("le", le), ("m", str(m))), rows[k]))
    for rank, (labels, values) in enumerate(sorted(buckets)):  # creation order = label order
        text = ", ".join(f'{k}="{v}"' for k, v in labels)
        out.append({"series": f"h_bucket{{{text}}}", "values": " ".join(["_"] * rank + values[: POINTS - rank])})
    return out


CHOICES = {"R": ["1m", "2m", "3m", "5m", "150s"], "S": ["30s", "1m", "90s", "2m"],
           "Q": ["0", "0.25", "0.5", "0.9", "1", "0.33"], "K": ["1", "2", "3", "2.9"],
           "N": ["0.5", "2", "0.1", "7", "1e-3"], "T": [str(s) for s in range(0, LAST_S + 1, STEP_S)]}


def _fill(draw: st.DrawFn, template: str) -> str:
    text = template
    while found := _placeholders(text):
        key = min(found)
        text = _replace_first(text, key, draw(st.sampled_from(CHOICES[key])))
    return text


def _placeholders(text: str) -> set[str]:
    """Placeholder letters standing alone in a template (not inside names or strings)."""
    found = set()
    for i, char in enumerate(text):
        if char in "RSQKTN" and not (text[i - 1: i].isalnum() or text[i + 1: i + 2].isalnum()) \
                and text[:i].count('"') % 2 == 0:
            found.add(char)
    return found


def _replace_first(text: str, key: str, value: str) -> str:
    for i, char in enumerate(text):
        if char == key and not (text[i - 1: i].isalnum() or text[i + 1: i + 2].isalnum()) \
                and text[:i].count('"') % 2 == 0:
            return text[:i] + value + text[i + 1:]
    return text


def _labels_text(labels: Labels) -> str:
    def quoted(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ", ".join(f'{k}="{quoted(v)}"' for k, v in labels) + "}"


def _yaml_value(value: float) -> float | str:
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return value


def _case(evaluator: Evaluator, expr: str, at_s: int) -> dict[str, object] | None:
    """A promtool case holding our result; None when our evaluator refuses the query at this time."""
    try:
        result = evaluator.query(expr, at_s * 1000)
        if isinstance(result, float):
            if math.isnan(result):
                return None
            samples = [((), result)]
        else:
            samples = result
            if any(math.isnan(v) for _, v in samples):  # NaN cannot be compared: keep the rest (promtool §6.3)
                expr = f"({expr}) == ({expr})"
                kept = evaluator.query(expr, at_s * 1000)
                assert isinstance(kept, list)
                samples = kept
    except EvaluationError:
        return None
    return {"expr": expr, "eval_time": f"{at_s}s",
            "exp_samples": [{"labels": _labels_text(labels), "value": _yaml_value(v)} for labels, v in samples]}


def _group(draw: st.DrawFn, constructs: list[str]) -> tuple[dict[str, object], int]:
    series = draw(series_sets())
    store = SeriesStore(retention_ms=10**12)
    load_series(store, series, STEP_S * 1000)
    evaluator = Evaluator(store, subquery_step_ms=STEP_S * 1000)
    cases = []
    for construct in constructs:
        for template in draw(st.lists(st.sampled_from(CONSTRUCTS[construct]), min_size=1, max_size=3, unique=True)):
            expr = _fill(draw, template)
            case = _case(evaluator, expr, draw(st.integers(0, LAST_S // STEP_S)) * STEP_S)
            if case is not None:
                cases.append(case)
    # the last case pins promtool's loading of samples to LAST_S, whatever the drawn times
    cases.append({"expr": "vector(1)", "eval_time": f"{LAST_S}s", "exp_samples": [{"labels": "{}", "value": 1}]})
    return {"interval": f"{STEP_S}s", "input_series": series, "promql_expr_test": cases}, len(cases) - 1


def run_promtool(promtool: Path, groups: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    """One ``promtool test rules`` run over a file holding every group."""
    doc = {"rule_files": [], "evaluation_interval": f"{STEP_S}s", "tests": groups}
    text = yaml.safe_dump(doc, sort_keys=False).replace("'.inf'", ".inf").replace("'-.inf'", "-.inf")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "constructs.yml"
        path.write_text(text)
        return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True,
                              timeout=120, check=False)


@st.composite
def promtool_groups(draw: st.DrawFn, count: int = 4) -> list[dict[str, object]]:
    """Test groups of one promtool file, each with its own series and a case or more per construct."""
    return [_group(draw, list(CONSTRUCTS))[0] for _ in range(count)]


# No shrinking: promtool's report already names each failing expression, its time and both results.
@settings(max_examples=40, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(groups=promtool_groups())
def test_every_construct_agrees_with_promtool(promtool: Path, groups: list[dict[str, object]]) -> None:
    """Every construct, on drawn series at drawn times, gives exactly promtool's result."""
    proc = run_promtool(promtool, groups)
    assert proc.returncode == 0, f"promtool disagrees with the evaluator:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"


_PLAIN_SERIES = [{"series": f'{name}{{i="{n}", j="{n % 2}"}}', "values": " ".join(["_"] * n + values)}
                 for n in range(3) for name, values in (
                     ("c", [repr(float(3 * k + n)) for k in range(POINTS - n)]),
                     ("g", [repr(float((k * (n + 2)) % 7 - 3)) for k in range(POINTS - n)]))] + [
    {"series": f'h_bucket{{le="{le}", m="0"}}', "values": " ".join(["_"] * rank + [
        repr(float(k * (rank + 1))) for k in range(POINTS - rank)])}
    for rank, le in enumerate(("+Inf", "0.25", "1.0", "2.5"))]
"""Ordinary series (no NaN, no gaps but the staggered starts), creation order = label order."""
_DUPLICATE_LABEL_SETS = {'label_replace(c, "i", "$1x$$", "j", "(.)")', 'label_join(c, "i", "", "nothing")'}
"""Over these series both make two series one label set: an error in Prometheus too."""


def test_every_template_evaluates_and_agrees_with_promtool(promtool: Path) -> None:
    """Each construct's templates, on ordinary series, give a result (the drawn test drops a case our
    evaluator refuses, so a construct that always failed would go unseen there) equal to promtool's."""
    store = SeriesStore(retention_ms=10**12)
    load_series(store, _PLAIN_SERIES, STEP_S * 1000)
    evaluator = Evaluator(store, subquery_step_ms=STEP_S * 1000)
    first = {key: values[1] for key, values in CHOICES.items()} | {"T": str(LAST_S // 2)}
    cases, refused = [], []
    for templates in CONSTRUCTS.values():
        for template in templates:
            expr = template
            while found := _placeholders(expr):
                key = min(found)
                expr = _replace_first(expr, key, first[key])
            case = _case(evaluator, expr, LAST_S)
            if case is None and expr not in _DUPLICATE_LABEL_SETS:
                refused.append(expr)
            elif case is not None:
                cases.append(case)
    assert not refused, f"the evaluator refused: {refused}"
    group: dict[str, object] = {"interval": f"{STEP_S}s", "input_series": _PLAIN_SERIES, "promql_expr_test": cases}
    proc = run_promtool(promtool, [group])
    assert proc.returncode == 0, f"promtool disagrees with the evaluator:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
