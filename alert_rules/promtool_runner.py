"""Runs promtool-format rule unit tests (``promtool test rules``) against the embedded engine.

Semantics follow promtool 2.42: every group is evaluated at the file's ``evaluation_interval``
from 0 to the largest ``eval_time`` (a group's own ``interval:`` is ignored); an alert check at
``eval_time`` sees the evaluation at or just before it and compares firing alerts only;
``promql_expr_test`` queries run after all evaluations; floats compare exactly; unknown keys
are errors. A test group without ``interval`` puts every input sample at t=0 (seen in 2.42).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alert_rules.engine import RuleEngine, RuleFileError, load_groups, parse_duration_ms
from alert_rules.promql.errors import EvaluationError, UnsupportedExpression
from alert_rules.promql.gofloat import format_float
from alert_rules.promql.values import NAME, STALE_NAN, Labels, labels_of
from alert_rules.store import SeriesStore
from exporters.errors import InferwatchError

FILE_KEYS = {"rule_files", "evaluation_interval", "group_eval_order", "tests"}
TEST_KEYS = {"name", "interval", "input_series", "alert_rule_test", "promql_expr_test"}
_NUMBER = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[Ii]nf|NaN)"
_EXPANDING = re.compile(rf"^(?P<a>{_NUMBER})(?:(?P<op>[-+])(?P<b>{_NUMBER}))?x(?P<n>[0-9]+)$")
_LABELS = re.compile(r'\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(?P<body>.*)\})?\s*', re.DOTALL)
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class TestFileError(InferwatchError, ValueError):
    """A test file cannot be read or has a bad shape."""


def parse_values(text: str) -> list[float | None]:
    """Expand promtool's series notation: ``1+2x3``, ``5x2``, ``_``, ``_x3``, ``stale``, numbers."""
    out: list[float | None] = []
    for token in str(text).split():
        if token == "_":  # noqa: S105 - a promtool series token, not a secret
            out.append(None)
        elif re.fullmatch(r"_x[0-9]+", token):
            out.extend([None] * int(token[2:]))
        elif token == "stale":  # noqa: S105 - a promtool series token, not a secret
            out.append(STALE_NAN)
        elif (match := _EXPANDING.match(token)) is not None:
            start, times = float(match["a"]), int(match["n"])
            step = 0.0 if match["op"] is None else float(match["b"]) * (-1 if match["op"] == "-" else 1)
            value = start
            out.append(value)
            for _ in range(times):
                value += step
                out.append(value)
        else:
            try:
                out.append(float(token))
            except ValueError:
                raise TestFileError(f"bad value {token!r} in series values {text!r}") from None
    return out


def parse_labels(text: str) -> Labels:
    """A series description ``name{a="b"}`` as a label set."""
    match = _LABELS.fullmatch(text)
    if match is None:
        raise TestFileError(f"bad series description {text!r}")
    pairs: dict[str, str] = {}
    body = match["body"] or ""
    pos = 0
    while pos < len(body.strip()):
        pair = _PAIR.match(body, pos)
        if pair is None:
            raise TestFileError(f"bad labels in series description {text!r}")
        pairs[pair[1]] = pair[2].encode().decode("unicode_escape")
        pos = pair.end()
    if match["name"]:
        pairs[NAME] = match["name"]
    return labels_of(pairs)


def load_series(store: SeriesStore, input_series: Sequence[Mapping[str, Any]], interval_ms: int) -> int:
    """Append promtool ``input_series`` to a store; returns the time of the last sample (ms)."""
    last = 0
    for item in input_series or []:
        unknown = set(item) - {"series", "values"}
        if unknown:
            raise TestFileError(f"input_series: unknown keys {sorted(unknown)}")
        labels = parse_labels(str(item["series"]))
        for index, value in enumerate(parse_values(str(item.get("values", "")))):
            if value is None:
                continue
            store.append(labels, index * interval_ms, value)
            last = max(last, index * interval_ms)
    return last


def format_duration(ms: int) -> str:
    """Prometheus' duration text (``1h30m``, ``0s``)."""
    if ms == 0:
        return "0s"
    out = ""
    for unit, size in (("y", 31_536_000_000), ("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out


def _fmt_labels(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


def _fmt_samples(samples: Iterable[tuple[Labels, float]]) -> str:
    items = [f"{_fmt_labels(labels)} {format_float(value, 'E')}" for labels, value in samples]
    return ", ".join(items) if items else "nil"


@dataclass
class FileResult:
    """The outcome of one test file."""

    path: str
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every test passed."""
        return not self.failures and not self.errors


def _strict(mapping: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        raise TestFileError(f"{where}: expected a mapping")
    unknown = set(mapping) - allowed
    if unknown:
        raise TestFileError(f"{where}: field {sorted(unknown)[0]} not found in type (unknown key)")
    return mapping


def run_file(path: str | Path) -> FileResult:
    """Run every test group of one promtool test file."""
    result = FileResult(str(path))
    try:
        doc = yaml.safe_load(Path(path).read_text())
        doc = _strict(doc, FILE_KEYS, str(path))
        base = Path(path).parent
        documents = []
        for pattern in doc.get("rule_files") or []:
            matched = sorted(glob.glob(str(base / pattern))) or [str(base / pattern)]
            for rule_file in matched:
                documents.append((rule_file, yaml.safe_load(Path(rule_file).read_text())))
        groups = [g for name, d in documents for g in load_groups(d, name)]
        interval = parse_duration_ms(doc.get("evaluation_interval") or "1m", "evaluation_interval")
        order = doc.get("group_eval_order") or None
        for index, raw_test in enumerate(doc.get("tests") or []):
            test = _strict(raw_test, TEST_KEYS, f"tests[{index}]")
            result.failures.extend(run_test(groups, test, interval, order))
    except (OSError, yaml.YAMLError, TestFileError, RuleFileError, UnsupportedExpression) as err:
        result.errors.append(str(err))
    return result


def run_test(groups: Sequence[Any], test: Mapping[str, Any], eval_interval_ms: int,
             order: Sequence[str] | None) -> list[str]:
    """Run one test group; returns promtool-like failure texts (empty when it passed)."""
    store = SeriesStore(retention_ms=10 * 365 * 86_400_000, max_series=10_000_000)
    engine = RuleEngine(groups, store, default_interval_ms=eval_interval_ms,
                        recorded_retention_ms=10 * 365 * 86_400_000)
    series_interval = parse_duration_ms(test.get("interval") or 0, "interval")
    load_series(store, test.get("input_series") or [], series_interval)
    alert_tests = [_strict(a, {"eval_time", "alertname", "exp_alerts"}, "alert_rule_test")
                   for a in test.get("alert_rule_test") or []]
    expr_tests = [_strict(e, {"expr", "eval_time", "exp_samples"}, "promql_expr_test")
                  for e in test.get("promql_expr_test") or []]
    times = [parse_duration_ms(a.get("eval_time") or 0, "eval_time") for a in alert_tests]
    expr_times = [parse_duration_ms(e.get("eval_time") or 0, "eval_time") for e in expr_tests]
    max_t = max(times + expr_times + [0])
    failures: list[str] = []
    errors: list[str] = []
    pending = sorted(range(len(alert_tests)), key=lambda i: times[i])
    cursor = 0
    t = 0
    while t <= max_t:
        step = engine.evaluate_all(t, order)
        errors.extend(f"    rule evaluation at {format_duration(t)}: {e}" for e in step.errors)
        while cursor < len(pending) and t <= times[pending[cursor]] < t + eval_interval_ms:
            i = pending[cursor]
            failures.extend(_check_alerts(engine, alert_tests[i], times[i]))
            cursor += 1
        t += eval_interval_ms
    for test_case, at in zip(expr_tests, expr_times, strict=True):
        failures.extend(_check_expr(engine, test_case, at))
    if errors:
        return errors + failures
    return failures


def _check_alerts(engine: RuleEngine, case: Mapping[str, Any], at: int) -> list[str]:
    name = str(case.get("alertname", ""))
    got = sorted((a.labels, tuple(sorted(a.annotations.items()))) for a in engine.firing(name))
    expected = []
    for raw in case.get("exp_alerts") or []:
        item = _strict(raw, {"exp_labels", "exp_annotations"}, "exp_alerts")
        labels = labels_of({**{k: str(v) for k, v in (item.get("exp_labels") or {}).items()},
                            "alertname": name})
        annotations = tuple(sorted((k, str(v)) for k, v in (item.get("exp_annotations") or {}).items()))
        expected.append((labels, annotations))
    expected.sort()
    if got == expected:
        return []

    def show(items: list[tuple[Labels, tuple[tuple[str, str], ...]]]) -> str:
        if not items:
            return "[]"
        rows = [f"\n            {i}:\n              Labels:{_fmt_labels(lab)}\n"
                f"              Annotations:{_fmt_labels(ann)}" for i, (lab, ann) in enumerate(items)]
        return "[" + "".join(rows) + "\n            ]"

    return [f"    alertname: {name}, time: {format_duration(at)}, \n        exp:{show(expected)}, "
            f"\n        got:{show(got)}"]


def _check_expr(engine: RuleEngine, case: Mapping[str, Any], at: int) -> list[str]:
    expr = str(case.get("expr", ""))
    head = f'    expr: "{expr}", time: {format_duration(at)},'
    try:
        value = engine.evaluator.query(expr, at)
    except (EvaluationError, UnsupportedExpression) as err:
        return [f"{head}\n        err: {err}"]
    got = [((), value)] if isinstance(value, float) else list(value)
    expected = []
    for raw in case.get("exp_samples") or []:
        item = _strict(raw, {"labels", "value"}, "exp_samples")
        expected.append((parse_labels(str(item.get("labels") or "{}")), float(item.get("value", 0))))
    got.sort(key=lambda s: s[0])
    expected.sort(key=lambda s: s[0])
    same = len(got) == len(expected) and all(
        gl == el and gv == ev for (gl, gv), (el, ev) in zip(got, expected, strict=True))
    if same:
        return []
    return [f"{head}\n        exp: {_fmt_samples(expected)}\n        got: {_fmt_samples(got)}"]


def run_files(paths: Sequence[str | Path]) -> tuple[list[FileResult], str]:
    """Run test files; returns the results and a promtool-like report."""
    results = []
    lines = []
    for path in paths:
        res = run_file(path)
        results.append(res)
        lines.append(f"Unit Testing:  {path}")
        if res.errors:
            lines.append("  FAILED:")
            lines.extend(f"    {e}" for e in res.errors)
        elif res.failures:
            lines.append("  FAILED:")
            lines.extend(res.failures)
        else:
            lines.append("  SUCCESS")
        lines.append("")
    return results, "\n".join(lines)
