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
from typing import Protocol

from alert_rules.promql import functions as fn
from alert_rules.promql.ast import (
    Aggregate,
    Binary,
    Call,
    Matcher,
    Negate,
    Node,
    Number,
    RangeSelector,
    Selector,
)
from alert_rules.promql.errors import EvaluationError
from alert_rules.promql.parse import COMPARISONS, parse_expr
from alert_rules.promql.shared import Reads, Shared
from alert_rules.promql.values import NAME, Labels, Vector, drop_name, get, keep_only, without

DEFAULT_LOOKBACK_MS = 5 * 60 * 1000
GROUP_KEYS_KEPT = 200_000
"""Label sets whose aggregation key is remembered, per grouping, before that memory is dropped."""
ARITHMETIC_DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})


class Queryable(Protocol):
    """What the evaluator reads: a store of series (see :class:`alert_rules.store.SeriesStore`)."""

    def instant(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                lookback_ms: int) -> list[tuple[Labels, float]]:
        """Latest sample per matching series within the lookback."""
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


def _go_pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf if a > 0 or (float(b).is_integer() and int(b) % 2 == 0) else -math.inf
    except ValueError:
        if a == 0 and b < 0:
            return math.inf
        return math.nan


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
        return _go_pow(a, b), True
    if op == "atan2":
        return math.atan2(a, b), True
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
    "exp": lambda v: math.exp(v) if v < 709.8 else math.inf,
    "ln": lambda v: math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    "log2": lambda v: math.log2(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    "log10": lambda v: math.log10(v) if v > 0 else (-math.inf if v == 0 else math.nan),
}


class Evaluator:
    """Evaluates expressions at one instant over a :class:`Queryable`."""

    def __init__(self, store: Queryable, lookback_ms: int = DEFAULT_LOOKBACK_MS,
                 shared: Shared | None = None) -> None:
        """``shared`` (from :func:`alert_rules.promql.shared.share`): subtrees whose result is reused
        while the evaluation time and the series they read are unchanged."""
        self.store = store
        self.lookback_ms = lookback_ms
        self.shared: Shared = shared or {}
        self._reused: dict[int, tuple[tuple[int, int], Result]] = {}
        self._group_keys: dict[tuple[bool, frozenset[str]], dict[Labels, Labels]] = {}

    def query(self, expr: str | Node, t_ms: int) -> Result:
        """Evaluate ``expr`` at ``t_ms``: a vector (list of (labels, value)) or a scalar float."""
        node = parse_expr(expr) if isinstance(expr, str) else expr
        if isinstance(node, RangeSelector):
            raise EvaluationError("a range vector cannot be the result of a rule or a query here")
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
        stamp = (t, self.store.generation(reads))
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
            return self.store.instant(node.name, node.matchers, t - node.offset_ms, self.lookback_ms)
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
        if name == "vector":
            return [((), self.scalar(node.args[0], t))]
        if name == "scalar":
            vec = self.vector(node.args[0], t)
            return vec[0][1] if len(vec) == 1 else math.nan
        if name in _SIMPLE:
            func = _SIMPLE[name]
            return [(drop_name(labels), func(v)) for labels, v in self.vector(node.args[0], t)]
        if name in ("clamp", "clamp_min", "clamp_max"):
            return self.clamp(node, t)
        if name == "absent":
            if self.vector(node.args[0], t):
                return []
            return [(self.absent_labels(node.args[0]), 1.0)]
        if name == "histogram_quantile":
            return self.histogram_quantile(self.scalar(node.args[0], t), self.vector(node.args[1], t))
        return self.range_function(node, t)

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
        for m in selector.matchers:
            if m.name == NAME:
                continue
            if m.op == "=":
                seen[m.name] = None if m.name in seen else m.value
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
        assert isinstance(matrix_arg, RangeSelector)
        sel = matrix_arg.selector
        end = t - sel.offset_ms
        start = end - matrix_arg.range_ms
        if name in ("rate", "increase", "delta"):
            return self.extrapolated(name, sel, start, end, matrix_arg.range_ms)
        window = self.store.window(sel.name, sel.matchers, start, end)
        if name == "absent_over_time":
            return [] if window else [(self.absent_labels(matrix_arg), 1.0)]
        horizon = self.scalar(node.args[1], t) if name == "predict_linear" else 0.0
        out: Vector = []
        for labels, ts, vs in window:
            value = self.over_time(name, ts, vs, start, end, matrix_arg.range_ms, param, horizon, t)
            if value is None:
                continue
            out.append((labels if name == "last_over_time" else drop_name(labels), value))
        if name != "last_over_time":
            _check_unique(sel, out)
        return out

    def extrapolated(self, name: str, sel: Selector, start: int, end: int, range_ms: int) -> Vector:
        """rate, increase or delta of every selected series, from the store's per-window increases."""
        counter = name != "delta"
        rows = self.store.increases(sel.name, sel.matchers, start, end, counter)
        out = fn.extrapolate_rows(rows, start, end, range_ms, counter, name == "rate")
        _check_unique(sel, out)
        return out

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
            "quantile_over_time": lambda v: fn.quantile(param, v),
        }
        return table[name](vs)

    # aggregation

    def aggregate(self, node: Aggregate, t: int) -> Vector:
        param = self.scalar(node.param, t) if node.param is not None else 0.0
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
            return self.top(op, param, vec, keys, key_of)
        groups: dict[Labels, list] = {}
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
    def top(op: str, param: float, vec: Vector, keys: dict[Labels, Labels],
            key_of: Callable[[Labels], Labels]) -> Vector:
        """topk / bottomk as Prometheus 2.42 computes them: the input series keep their labels; per group,
        a sample replaces the current k-th only when strictly better (the earlier input wins a tie), and
        each group's survivors come out best first."""
        if math.isnan(param) or param < 1:
            return []
        k = int(min(param, 1e9))
        top = op == "topk"

        def better(a: float, b: float) -> bool:  # a strictly better than b
            if math.isnan(b):
                return not math.isnan(a)
            return a > b if top else a < b

        groups: dict[Labels, list[tuple[Labels, float]]] = {}
        for labels, value in vec:
            key = keys.get(labels)
            if key is None:
                key = keys[labels] = key_of(labels)
            kept = groups.setdefault(key, [])
            if len(kept) < k:
                kept.append((labels, value))
                continue
            worst = min(range(len(kept)), key=lambda i: (not math.isnan(kept[i][1]),
                                                            kept[i][1] if top else -kept[i][1]))
            if better(value, kept[worst][1]):
                kept[worst] = (labels, value)
        out: Vector = []
        for kept in groups.values():
            out.extend(sorted(kept, key=lambda s: (math.isnan(s[1]), -s[1] if top else s[1])))
        return out

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


def _check_unique(sel: Selector, out: Vector) -> None:
    """Refuse a result holding one label set twice (only possible when no metric name is selected)."""
    if sel.name is None and len({labels for labels, _ in out}) != len(out):
        raise EvaluationError("vector cannot contain metrics with the same labelset")


def _fmt(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"
