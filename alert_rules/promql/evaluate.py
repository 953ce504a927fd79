"""Instant evaluation of the supported PromQL subset, following Prometheus 2.42's engine.

Series order follows Prometheus for instant queries: selectors return series sorted by label
set, functions keep their input's order, aggregations emit groups in order of first appearance,
and binary operations follow their left-hand side. Float results therefore match bit for bit
wherever Prometheus' own order is deterministic.

Given the shared subtrees of a rule set (:func:`alert_rules.promql.shared.share`), an evaluator
computes each once per evaluation time, again only after a write to a metric it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from alert_rules.promql import functions as fn
from alert_rules.promql import gomath, relabel, topk
from alert_rules.promql.ast import (
    Aggregate,
    At,
    Binary,
    Call,
    Matcher,
    Negate,
    Node,
    Number,
    RangeSelector,
    Selector,
    String,
    Subquery,
)
from alert_rules.promql.dates import DATE_FIELDS, go_int64, go_seconds
from alert_rules.promql.errors import EvaluationError
from alert_rules.promql.gofloat import format_float
from alert_rules.promql.parse import COMPARISONS, parse_expr
from alert_rules.promql.shared import Reads, Shared
from alert_rules.promql.values import NAME, Labels, Vector, drop_name, get, keep_only, without

DEFAULT_LOOKBACK_MS = 5 * 60 * 1000
DEFAULT_SUBQUERY_STEP_MS = 60_000
"""A subquery's step when it names none: Prometheus' global evaluation interval (1m by default)."""
GROUP_KEYS_KEPT = 200_000
"""Label sets whose aggregation key is remembered, per grouping, before that memory is dropped."""
ARITHMETIC_DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^"})
"""Operators whose result loses the metric name (Prometheus 2.42 keeps it for atan2)."""


class Queryable(Protocol):
    """What the evaluator reads: a store of series (see :class:`alert_rules.store.SeriesStore`)."""

    def instant(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                lookback_ms: int) -> list[tuple[Labels, float]]:
        """Latest sample per matching series within the lookback."""
        ...

    def instant_times(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                      lookback_ms: int) -> list[tuple[Labels, int]]:
        """The time of the sample ``instant`` picks, per series."""
        ...

    def window(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int,
               maxt_ms: int) -> list[tuple[Labels, Sequence[int], Sequence[float]]]:
        """Samples per matching series within ``[mint, maxt]``."""
        ...

    def increases(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int, maxt_ms: int,
                  counter: bool) -> list[tuple[Labels, int, int, int, float, float]]:
        """Per matching series with two samples or more in ``[mint, maxt]``: (labels without the
        name, count, first time, last time, first value, last - first with resets added back)."""
        ...

    def generation(self, names: frozenset[str] | None) -> int:
        """A number that changes whenever a series of one of these metric names (None: any) changes."""
        ...


Result = Vector | float
Matrix = list[tuple[Labels, Sequence[int], Sequence[float]]]


def _go_max(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return a if a > b else b


def _go_min(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return a if a < b else b


def _go_mod(a: float, b: float) -> float:
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(b):
        return a
    return math.fmod(a, b)


def _go_div(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        negative = (a < 0) != (math.copysign(1.0, b) < 0)
        return -math.inf if negative else math.inf


def _go_float(text: str) -> float | None:
    """strconv.ParseFloat for an ``le`` label value; None when Go would refuse it."""
    if not text or "_" in text or text != text.strip():
        return None
    try:
        return float(text)
    except ValueError:
        try:
            return float.fromhex(text)
        except ValueError:
            return None


def arith(op: str, a: float, b: float) -> tuple[float, bool]:
    """Prometheus' vectorElemBinop: (value, keep)."""
    if op == "+":
        return a + b, True
    if op == "-":
        return a - b, True
    if op == "*":
        return a * b, True
    if op == "/":
        return _go_div(a, b), True
    if op == "%":
        return _go_mod(a, b), True
    if op == "^":
        return gomath.pow(a, b), True
    if op == "atan2":
        return gomath.atan2(a, b), True
    if op == "==":
        return a, a == b
    if op == "!=":
        return a, a != b
    if op == ">":
        return a, a > b
    if op == "<":
        return a, a < b
    if op == ">=":
        return a, a >= b
    if op == "<=":
        return a, a <= b
    raise EvaluationError(f"operator {op!r} is not defined between these operands")


_SIMPLE: dict[str, Callable[[float], float]] = {
    "abs": abs, "ceil": lambda v: float(math.ceil(v)) if math.isfinite(v) else v,
    "floor": lambda v: float(math.floor(v)) if math.isfinite(v) else v,
    "sqrt": lambda v: math.sqrt(v) if v >= 0 else math.nan,
    "exp": gomath.exp, "ln": gomath.log, "log2": gomath.log2, "log10": gomath.log10,
    "sgn": lambda v: -1.0 if v < 0 else (1.0 if v > 0 else v),
    "deg": lambda v: v * 180 / math.pi, "rad": lambda v: v * math.pi / 180,
    "sin": gomath.sin, "cos": gomath.cos, "tan": gomath.tan, "asin": gomath.asin, "acos": gomath.acos,
    "atan": gomath.atan, "sinh": gomath.sinh, "cosh": gomath.cosh, "tanh": gomath.tanh, "asinh": gomath.asinh,
    "acosh": gomath.acosh, "atanh": gomath.atanh,
}
KEEP_NAME = frozenset({"last_over_time", "sort", "sort_desc", "label_replace", "label_join"})
"""Functions whose result keeps the input's metric name (every other one drops it)."""


class Evaluator:
    """Evaluates expressions at one instant over a :class:`Queryable`."""

    def __init__(self, store: Queryable, lookback_ms: int = DEFAULT_LOOKBACK_MS,
                 shared: Shared | None = None, subquery_step_ms: int = DEFAULT_SUBQUERY_STEP_MS) -> None:
        """``shared`` (from :func:`alert_rules.promql.shared.share`): subtrees whose result is reused
        while the evaluation time and the series they read are unchanged. ``subquery_step_ms``: the
        step of subqueries that name none (Prometheus' global evaluation interval)."""
        self.store = store
        self.lookback_ms = lookback_ms
        self.shared: Shared = shared or {}
        self.subquery_step_ms = subquery_step_ms
        self._query_ms = 0  # the query's own time: what @ start() and @ end() stand for
        self._reused: dict[int, tuple[tuple[int, int, int], Result]] = {}
        self._group_keys: dict[tuple[bool, frozenset[str]], dict[Labels, Labels]] = {}

    def query(self, expr: str | Node, t_ms: int) -> Result:
        """Evaluate ``expr`` at ``t_ms``: a vector (list of (labels, value)) or a scalar float."""
        node = parse_expr(expr) if isinstance(expr, str) else expr
        if node.kind in ("matrix", "string"):
            raise EvaluationError(f"a {node.kind} cannot be the result of a rule or a query here")
        self._query_ms = t_ms
        return self.eval(node, t_ms)

    def eval(self, node: Node, t: int) -> Result:
        """Evaluate one node (results of shared subtrees are shared too: never modify a result)."""
        if self.shared:
            entry = self.shared.get(id(node))
            if entry is not None and entry[0] is node:
                return self.reuse(node, entry[1], t)
        return self.compute(node, t)

    def reuse(self, node: Node, reads: Reads, t: int) -> Result:
        """A shared subtree's result, computed again only when the time or the series it reads changed."""
        stamp = (t, self._query_ms, self.store.generation(reads))
        held = self._reused.get(id(node))
        if held is not None and held[0] == stamp:
            return held[1]
        result = self.compute(node, t)
        self._reused[id(node)] = (stamp, result)
        return result

    def compute(self, node: Node, t: int) -> Result:
        """Evaluate one node's operation."""
        if isinstance(node, Number):
            return node.value
        if isinstance(node, Selector):
            return self.store.instant(node.name, node.matchers, self.ref_time(node.offset_ms, node.at, t),
                                      self.lookback_ms)
        if isinstance(node, Call):
            return self.call(node, t)
        if isinstance(node, Aggregate):
            return self.aggregate(node, t)
        if isinstance(node, Binary):
            return self.binary(node, t)
        if isinstance(node, Negate):
            inner = self.eval(node.expr, t)
            if isinstance(inner, float):
                return -inner
            return [(drop_name(labels), -v) for labels, v in inner]
        raise EvaluationError(f"cannot evaluate {type(node).__name__} here")

    def ref_time(self, offset_ms: int, at: At, t: int) -> int:
        """The time a selector or subquery reads at: its @ time (start() and end() are the query's time, even
        inside a subquery) or the evaluation time, less the offset."""
        if at is None:
            return t - offset_ms
        return (self._query_ms if isinstance(at, str) else at) - offset_ms

    def vector(self, node: Node, t: int) -> Vector:
        """Evaluate a node that must give an instant vector."""
        value = self.eval(node, t)
        if isinstance(value, float):
            raise EvaluationError("expected an instant vector, got a scalar")
        return value

    def scalar(self, node: Node, t: int) -> float:
        """Evaluate a node that must give a scalar."""
        value = self.eval(node, t)
        if not isinstance(value, float):
            raise EvaluationError("expected a scalar, got an instant vector")
        return value

    # functions

    def call(self, node: Call, t: int) -> Result:
        name = node.func
        if name == "time":
            return t / 1000
        if name == "pi":
            return math.pi
        if name in DATE_FIELDS:
            field = DATE_FIELDS[name]
            if not node.args:
                return [((), field(go_seconds(t)))]
            return _unique([(drop_name(labels), field(go_int64(v))) for labels, v in self.vector(node.args[0], t)])
        if name == "timestamp":
            return self.timestamp(node.args[0], t)
        if name in ("label_replace", "label_join", "round", "sort", "sort_desc"):
            return self.vector_function(node, t)
        if name in ("histogram_count", "histogram_sum", "histogram_fraction"):
            for arg in node.args:
                self.eval(arg, t)
            return []  # these read native histograms only, and the store holds floats only
        if name == "vector":
            return [((), self.scalar(node.args[0], t))]
        if name == "scalar":
            vec = self.vector(node.args[0], t)
            return vec[0][1] if len(vec) == 1 else math.nan
        if name in _SIMPLE:
            func = _SIMPLE[name]
            out = [(drop_name(labels), func(v)) for labels, v in self.vector(node.args[0], t)]
            return out if _one_name(node.args[0]) else _unique(out)
        if name in ("clamp", "clamp_min", "clamp_max"):
            return self.clamp(node, t)
        if name == "absent":
            if self.vector(node.args[0], t):
                return []
            return [(self.absent_labels(node.args[0]), 1.0)]
        if name == "histogram_quantile":
            return self.histogram_quantile(self.scalar(node.args[0], t), self.vector(node.args[1], t))
        return self.range_function(node, t)

    def timestamp(self, arg: Node, t: int) -> Vector:
        """timestamp(): a selector's sample times; any other argument's samples are at the evaluation time."""
        if isinstance(arg, Selector):
            ref = self.ref_time(arg.offset_ms, arg.at, t)
            rows = self.store.instant_times(arg.name, arg.matchers, ref, self.lookback_ms)
            return _unique([(drop_name(labels), when / 1000) for labels, when in rows])
        return _unique([(drop_name(labels), t / 1000) for labels, _ in self.vector(arg, t)])

    def vector_function(self, node: Call, t: int) -> Vector:
        """round, sort, sort_desc, label_replace and label_join."""
        vec = self.vector(node.args[0], t)
        strings = [a.value for a in node.args[1:] if isinstance(a, String)]
        name = node.func
        if name == "round":
            to_nearest = self.scalar(node.args[1], t) if len(node.args) > 1 else 1.0
            inverse = _go_div(1.0, to_nearest)
            return _unique([(drop_name(labels), _go_div(_floor(v * inverse + 0.5), inverse)) for labels, v in vec])
        if name in ("sort", "sort_desc"):
            descending = name == "sort_desc"
            return sorted(vec, key=lambda s: (math.isnan(s[1]), -s[1] if descending else s[1]))
        if name == "label_replace":
            dst, replacement, src, regex = strings
            return _unique(relabel.label_replace(vec, dst, replacement, src, relabel.compile_anchored(regex)))
        return _unique(relabel.label_join(vec, strings[0], strings[1], tuple(strings[2:])))

    def clamp(self, node: Call, t: int) -> Vector:
        vec = self.vector(node.args[0], t)
        if node.func == "clamp":
            low, high = self.scalar(node.args[1], t), self.scalar(node.args[2], t)
            if high < low:
                return []
            return [(drop_name(labels), _go_max(low, _go_min(high, v))) for labels, v in vec]
        bound = self.scalar(node.args[1], t)
        pick = _go_max if node.func == "clamp_min" else _go_min
        return [(drop_name(labels), pick(bound, v)) for labels, v in vec]

    @staticmethod
    def absent_labels(arg: Node) -> Labels:
        selector = arg.selector if isinstance(arg, RangeSelector) else arg
        if not isinstance(selector, Selector):
            return ()
        seen: dict[str, str | None] = {}
        for m in selector.matchers:  # Prometheus: a label matched other than by one "=" is left out
            if m.name == NAME:
                continue
            seen[m.name] = m.value if m.op == "=" and m.name not in seen else None
        return tuple(sorted((k, v) for k, v in seen.items() if v is not None and v != ""))

    def histogram_quantile(self, q: float, vec: Vector) -> Vector:
        groups: dict[Labels, tuple[Labels, list[tuple[float, float]]]] = {}
        for labels, value in vec:
            bound = _go_float(get(labels, "le"))
            if bound is None:
                continue
            key = tuple(p for p in labels if p[0] != "le")
            entry = groups.get(key)
            if entry is None:
                entry = groups[key] = (tuple(p for p in key if p[0] != NAME), [])
            entry[1].append((bound, value))
        return [(labels, fn.bucket_quantile(q, buckets)) for labels, buckets in groups.values()]

    def range_function(self, node: Call, t: int) -> Vector:
        name = node.func
        param = self.scalar(node.args[0], t) if name == "quantile_over_time" else 0.0
        matrix_arg = node.args[1] if name == "quantile_over_time" else node.args[0]
        assert isinstance(matrix_arg, RangeSelector | Subquery)
        if isinstance(matrix_arg, RangeSelector):
            sel = matrix_arg.selector
            end = self.ref_time(sel.offset_ms, sel.at, t)
            start = end - matrix_arg.range_ms
            if name in ("rate", "increase", "delta"):
                return self.extrapolated(name, sel, start, end, matrix_arg.range_ms)
            window: Matrix = self.store.window(sel.name, sel.matchers, start, end)
        else:
            start, end, window = self.subquery(matrix_arg, t)
        if name == "absent_over_time":
            return [] if window else [(self.absent_labels(matrix_arg), 1.0)]
        horizon = self.scalar(node.args[1], t) if name == "predict_linear" else 0.0
        out: Vector = []
        for labels, ts, vs in window:
            value = self.over_time(name, ts, vs, start, end, matrix_arg.range_ms, param, horizon, t)
            if value is None:
                continue
            out.append((labels if name == "last_over_time" else drop_name(labels), value))
        return out if name == "last_over_time" or _one_name(matrix_arg) else _unique(out)

    def subquery(self, node: Subquery, t: int) -> tuple[int, int, Matrix]:
        """(window start, window end, series) of a subquery: its expression evaluated at every multiple of
        the step within ``[end - range, end]``, both ends included."""
        end = self.ref_time(node.offset_ms, node.at, t)
        step = node.step_ms or self.subquery_step_ms
        start = end - node.range_ms
        first = -(-start // step) * step
        series: dict[Labels, tuple[list[int], list[float]]] = {}
        for at in range(first, end + 1, step):
            for labels, value in self.vector(node.expr, at):
                ts, vs = series.setdefault(labels, ([], []))
                ts.append(at)
                vs.append(value)
        return start, end, [(labels, ts, vs) for labels, (ts, vs) in series.items()]

    def extrapolated(self, name: str, sel: Selector, start: int, end: int, range_ms: int) -> Vector:
        """rate, increase or delta of every selected series, from the store's per-window increases."""
        counter = name != "delta"
        rows = self.store.increases(sel.name, sel.matchers, start, end, counter)
        out = fn.extrapolate_rows(rows, start, end, range_ms, counter, name == "rate")
        return _unique(out) if sel.name is None else out

    @staticmethod
    def over_time(name: str, ts: Sequence[int], vs: Sequence[float], start: int, end: int,
                  range_ms: int, param: float, horizon: float, t: int) -> float | None:
        if name in ("rate", "increase", "delta"):
            return fn.extrapolated_rate(ts, vs, start, end, range_ms, name != "delta", name == "rate")
        if name in ("irate", "idelta"):
            return fn.instant_rate(ts, vs, name == "irate")
        if name == "deriv":
            return fn.linear_regression(ts, vs, ts[0])[0] if len(vs) >= 2 else None
        if name == "predict_linear":
            if len(vs) < 2:
                return None
            slope, intercept = fn.linear_regression(ts, vs, t)
            return slope * horizon + intercept
        table: dict[str, Callable[[Sequence[float]], float]] = {
            "avg_over_time": fn.avg_over_time, "sum_over_time": fn.sum_over_time,
            "max_over_time": fn.max_over_time, "min_over_time": fn.min_over_time,
            "count_over_time": lambda v: float(len(v)), "last_over_time": lambda v: v[-1],
            "present_over_time": lambda v: 1.0, "changes": fn.changes, "resets": fn.resets,
            "quantile_over_time": lambda v: fn.quantile(param, v), "stdvar_over_time": fn.stdvar_over_time,
            "stddev_over_time": lambda v: math.sqrt(fn.stdvar_over_time(v)),
        }
        return table[name](vs)

    # aggregation

    def aggregate(self, node: Aggregate, t: int) -> Vector:
        # count_values' parameter is a label name (a string), the others' a scalar
        param = self.scalar(node.param, t) if node.param is not None and node.op != "count_values" else 0.0
        vec = self.vector(node.expr, t)
        op = node.op
        keys, key_of = self.group_keys(node)  # series repeat every evaluation: keys are remembered
        if op == "sum":  # the common case, kept to a few dict operations per input sample
            sums: dict[Labels, float] = {}
            for labels, value in vec:
                key = keys.get(labels)
                if key is None:
                    key = keys[labels] = key_of(labels)
                total = sums.get(key)
                sums[key] = value if total is None else total + value
            return list(sums.items())
        if op in ("topk", "bottomk"):
            if not -9.223372036854775808e18 <= param <= 9.223372036854775807e18:
                raise EvaluationError(f"Scalar value {format_float(param, 'g')} overflows int64")
            k = go_int64(param)
            return [] if k < 1 else topk.select(op, k, vec, lambda labels: _key(keys, key_of, labels))
        if op == "count_values":
            assert isinstance(node.param, String)
            return self.count_values(node, node.param.value, vec)
        if op in ("stddev", "stdvar"):
            return self.deviation(op, vec, keys, key_of)
        groups: dict[Labels, list[Any]] = {}
        for labels, value in vec:
            key = keys.get(labels)
            if key is None:
                key = keys[labels] = key_of(labels)
            group = groups.get(key)
            if group is None:
                groups[key] = [value, 1, [value] if op == "quantile" else None]
                continue
            group[1] += 1
            if op == "avg":
                group[0] = _avg_step(group[0], value, group[1])
            elif op == "max":
                if group[0] < value or math.isnan(group[0]):
                    group[0] = value
            elif op == "min":
                if group[0] > value or math.isnan(group[0]):
                    group[0] = value
            elif op == "quantile":
                group[2].append(value)
        out: Vector = []
        for key, (total, count, values) in groups.items():
            if op == "count":
                out.append((key, float(count)))
            elif op == "group":
                out.append((key, 1.0))
            elif op == "quantile":
                out.append((key, fn.quantile(param, values)))
            else:
                out.append((key, total))
        return out

    @staticmethod
    def deviation(op: str, vec: Vector, keys: dict[Labels, Labels], key_of: Callable[[Labels], Labels]) -> Vector:
        """stddev / stdvar: Welford's running mean and sum of squares, uncompensated, as Prometheus 2.42."""
        groups: dict[Labels, list[float]] = {}
        for labels, value in vec:
            key = _key(keys, key_of, labels)
            group = groups.get(key)
            if group is None:
                groups[key] = [1.0, value, 0.0]
                continue
            group[0] += 1
            delta = value - group[1]
            group[1] += delta / group[0]
            group[2] += delta * (value - group[1])
        if op == "stdvar":
            return [(key, aux / count) for key, (count, _, aux) in groups.items()]
        return [(key, math.sqrt(aux / count)) for key, (count, _, aux) in groups.items()]

    @staticmethod
    def count_values(node: Aggregate, label: str, vec: Vector) -> Vector:
        """count_values: each value, as Go's shortest %f text, becomes ``label``; series with equal values
        count together (``by`` keeps the label, ``without`` keeps every label not named)."""
        counts: dict[Labels, float] = {}
        names = frozenset(node.grouping)
        dropped = names | {NAME}
        kept = names | {label}
        for labels, value in vec:
            metric = tuple(sorted([*(p for p in labels if p[0] != label), (label, format_float(value, "f"))]))
            key = without(metric, dropped) if node.without else keep_only(metric, kept)
            counts[key] = counts.get(key, 0.0) + 1
        return list(counts.items())

    def group_keys(self, node: Aggregate) -> tuple[dict[Labels, Labels], Callable[[Labels], Labels]]:
        """The remembered label set -> group labels of this grouping, and the function filling it in."""
        names = frozenset(node.grouping)
        cache = self._group_keys.get((node.without, names))
        if cache is None or len(cache) > GROUP_KEYS_KEPT:
            cache = self._group_keys[(node.without, names)] = {}
        if node.without:
            dropped = names | {NAME}
            return cache, lambda labels: without(labels, dropped)
        return cache, lambda labels: keep_only(labels, names)

    # binary operators

    def binary(self, node: Binary, t: int) -> Result:
        lhs = self.eval(node.lhs, t)
        rhs = self.eval(node.rhs, t)
        op = node.op
        if isinstance(lhs, float) and isinstance(rhs, float):
            value, keep = arith(op, lhs, rhs)
            if op in COMPARISONS:
                return 1.0 if keep else 0.0
            return value
        if isinstance(lhs, float) or isinstance(rhs, float):
            return self.vector_scalar(node, lhs, rhs)
        assert isinstance(lhs, list)
        assert isinstance(rhs, list)
        if op in ("and", "or", "unless"):
            return self.set_op(node, lhs, rhs)
        return self.vector_vector(node, lhs, rhs)

    @staticmethod
    def vector_scalar(node: Binary, lhs: Result, rhs: Result) -> Vector:
        swap = isinstance(lhs, float)
        vec, scalar = (rhs, lhs) if swap else (lhs, rhs)
        assert isinstance(vec, list)
        assert isinstance(scalar, float)
        op = node.op
        comparison = op in COMPARISONS
        drop = op in ARITHMETIC_DROPS_NAME or node.return_bool
        out: Vector = []
        for labels, v in vec:
            a, b = (scalar, v) if swap else (v, scalar)
            value, keep = arith(op, a, b)
            if comparison and swap:
                value = b
            if node.return_bool:
                value = 1.0 if keep else 0.0
            elif not keep:
                continue
            out.append((drop_name(labels) if drop else labels, value))
        return out

    @staticmethod
    def signature(node: Binary) -> Callable[[Labels], Labels]:
        names = frozenset(node.matching)
        if node.on:
            return lambda labels: keep_only(labels, names)
        dropped = names | {NAME}
        return lambda labels: without(labels, dropped)

    def set_op(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        sig = self.signature(node)
        if node.op == "and":
            right = {sig(labels) for labels, _ in rhs}
            return [(labels, v) for labels, v in lhs if sig(labels) in right]
        if node.op == "unless":
            right = {sig(labels) for labels, _ in rhs}
            return [(labels, v) for labels, v in lhs if sig(labels) not in right]
        left = {sig(labels) for labels, _ in lhs}
        return lhs + [(labels, v) for labels, v in rhs if sig(labels) not in left]

    def vector_vector(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        sig = self.signature(node)
        op = node.op
        if node.card == "one-to-many":
            lhs, rhs = rhs, lhs
        right: dict[Labels, tuple[Labels, float]] = {}
        for labels, v in rhs:
            key = sig(labels)
            if key in right:
                side = "left" if node.card == "one-to-many" else "right"
                raise EvaluationError(
                    f"found duplicate series for the match group {_fmt(key)} on the {side} hand-side "
                    "of the operation; many-to-many matching not allowed: matching labels must be "
                    "unique on one side")
            right[key] = (labels, v)
        matched: dict[Labels, set[Labels] | None] = {}
        drop = op in ARITHMETIC_DROPS_NAME
        out: Vector = []
        for labels, lv in lhs:
            key = sig(labels)
            found = right.get(key)
            if found is None:
                continue
            rlabels, rv = found
            a, b = (rv, lv) if node.card == "one-to-many" else (lv, rv)
            value, keep = arith(op, a, b)
            if node.return_bool:
                value = 1.0 if keep else 0.0
            elif not keep:
                continue
            metric = self.result_labels(node, labels, rlabels, drop)
            if node.return_bool:
                metric = drop_name(metric)
            if node.card == "one-to-one":
                if key in matched:
                    raise EvaluationError("multiple matches for labels: many-to-one matching must be "
                                          "explicit (group_left/group_right)")
                matched[key] = None
            else:
                seen = matched.setdefault(key, set())
                assert seen is not None
                if metric in seen:
                    raise EvaluationError("multiple matches for labels: grouping labels must ensure "
                                          "unique matches")
                seen.add(metric)
            out.append((metric, value))
        return out

    @staticmethod
    def result_labels(node: Binary, lhs: Labels, rhs: Labels, drop: bool) -> Labels:
        labels = dict(lhs)
        if drop:
            labels.pop(NAME, None)
        if node.card == "one-to-one":
            if node.on:
                labels = {k: v for k, v in labels.items() if k in node.matching}
            else:
                for name in node.matching:
                    labels.pop(name, None)
        if node.include:
            other = dict(rhs)
            for name in node.include:
                value = other.get(name, "")
                if value:
                    labels[name] = value
                else:
                    labels.pop(name, None)
        return tuple(sorted(labels.items()))


def _avg_step(mean: float, value: float, count: int) -> float:
    if math.isinf(mean):
        if math.isinf(value) and (mean > 0) == (value > 0):
            return mean
        if not math.isinf(value) and not math.isnan(value):
            return mean
    return mean + (value / count - mean / count)


def _unique(out: Vector) -> Vector:
    """The result, refused as Prometheus refuses one holding a label set twice (after names were dropped or
    labels rewritten)."""
    if len(out) > 1 and len({labels for labels, _ in out}) != len(out):
        raise EvaluationError("vector cannot contain metrics with the same labelset")
    return out


def _one_name(node: Node) -> bool:
    """True when every series of the node's result has one metric name (dropping it keeps them apart)."""
    if isinstance(node, RangeSelector):
        node = node.selector
    return isinstance(node, Selector) and node.name is not None


def _key(keys: dict[Labels, Labels], key_of: Callable[[Labels], Labels], labels: Labels) -> Labels:
    """The group of a label set, remembered."""
    key = keys.get(labels)
    if key is None:
        key = keys[labels] = key_of(labels)
    return key


def _floor(v: float) -> float:
    return float(math.floor(v)) if math.isfinite(v) else v


def _fmt(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"
