"""PromQL text -> the evaluator's tree, refusing anything outside the supported subset.

``promql_parser`` (a binding of the Rust promql-parser crate) does the parsing; this module walks
its AST once and builds :mod:`alert_rules.promql.ast` nodes. The parser gives no positions, so a
refused construct is located by searching the expression text for it.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime, timedelta

import promql_parser as pp

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
from alert_rules.promql.errors import UnsupportedExpression

# function name -> argument kinds ("s" scalar, "v" instant vector, "m" range vector, "t" string);
# the parser has already checked counts and kinds against Prometheus' own table.
_MATH = ("abs", "ceil", "floor", "sqrt", "exp", "ln", "log2", "log10", "sgn", "deg", "rad", "acos", "acosh",
         "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh")
DATE_FUNCTIONS = ("day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month",
                  "year")
FUNCTIONS: dict[str, str] = {
    "rate": "m", "increase": "m", "delta": "m", "irate": "m", "idelta": "m", "deriv": "m",
    "predict_linear": "ms", "changes": "m", "resets": "m",
    "avg_over_time": "m", "max_over_time": "m", "min_over_time": "m", "sum_over_time": "m",
    "count_over_time": "m", "last_over_time": "m", "present_over_time": "m",
    "quantile_over_time": "sm", "absent_over_time": "m", "stddev_over_time": "m", "stdvar_over_time": "m",
    "histogram_quantile": "sv", "histogram_count": "v", "histogram_sum": "v", "histogram_fraction": "ssv",
    "clamp": "vss", "clamp_min": "vs", "clamp_max": "vs", "round": "vs",
    "absent": "v", "vector": "s", "scalar": "v", "time": "", "pi": "", "timestamp": "v",
    "sort": "v", "sort_desc": "v", "label_replace": "vtttt", "label_join": "vttt",
    **dict.fromkeys(_MATH, "v"), **dict.fromkeys(DATE_FUNCTIONS, "v"),
}
SCALAR_FUNCTIONS = frozenset({"scalar", "time", "pi"})
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count", "group", "quantile", "topk", "bottomk",
                          "stddev", "stdvar", "count_values"})
BINARY_OPS = frozenset({"+", "-", "*", "/", "%", "^", "atan2", "==", "!=", ">", "<", ">=", "<=",
                        "and", "or", "unless"})
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

SUBSET_SUMMARY = (
    "supported: selectors with =, !=, =~, !~, offset and @ (start(), end()); subqueries; number and "
    "string literals; functions " + ", ".join(sorted(FUNCTIONS)) + "; aggregations "
    + ", ".join(sorted(AGGREGATIONS)) + " with by/without; arithmetic, comparisons (with or without bool), "
    "and/or/unless, on/ignoring, group_left/group_right"
)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms(delta: timedelta) -> int:
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def _match_op(op: object) -> str:
    if op == pp.MatchOp.Equal:
        return "="
    if op == pp.MatchOp.NotEqual:
        return "!="
    if op == pp.MatchOp.Re:
        return "=~"
    return "!~"


def _cardinality(card: object) -> str:
    if card == pp.VectorMatchCardinality.ManyToOne:
        return "many-to-one"
    if card == pp.VectorMatchCardinality.OneToMany:
        return "one-to-many"
    if card == pp.VectorMatchCardinality.ManyToMany:
        return "many-to-many"
    return "one-to-one"


class _Converter:
    """Walks one promql_parser AST."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pinned = 0  # subqueries with @ enclosing the node being converted

    def refuse(self, construct: str, problem: str, pattern: str | None = None) -> UnsupportedExpression:
        position = None
        if pattern is not None:
            found = re.search(pattern, self.text)
            position = found.start() if found else None
        return UnsupportedExpression(self.text, construct, problem, position)

    def node(self, expr: object) -> Node:
        if isinstance(expr, pp.ParenExpr):
            return self.node(expr.expr)
        if isinstance(expr, pp.NumberLiteral):
            return Number(float(expr.val))
        if isinstance(expr, pp.StringLiteral):
            return String(str(expr.val))
        if isinstance(expr, pp.VectorSelector):
            return self.selector(expr, expr.at, expr.offset)
        if isinstance(expr, pp.MatrixSelector):
            inner = expr.vector_selector
            return RangeSelector(self.selector(inner, inner.at, inner.offset), _ms(expr.range))
        if isinstance(expr, pp.SubqueryExpr):
            return self.subquery(expr)
        if isinstance(expr, pp.UnaryExpr):
            operand = self.node(expr.expr)
            if isinstance(operand, Number):
                return Number(-operand.value)
            return Negate(operand, kind=operand.kind)
        if isinstance(expr, pp.Call):
            return self.call(expr)
        if isinstance(expr, pp.AggregateExpr):
            return self.aggregate(expr)
        if isinstance(expr, pp.BinaryExpr):
            return self.binary(expr)
        raise self.refuse(type(expr).__name__, "this kind of expression is not supported")

    def at(self, modifier: object) -> At:
        """An @ modifier as milliseconds (Go rounds the seconds to the nearest millisecond), start or end."""
        if modifier is None:
            return None
        if self.pinned:
            # Prometheus 2.42 moves such a node's time when the subquery's first step falls on the evaluation time
            raise self.refuse("@ modifier", "an @ inside a subquery that has its own @ is not supported", r"@")
        kind = str(getattr(modifier, "type", ""))
        if kind.endswith("Start"):
            return "start"
        if kind.endswith("End"):
            return "end"
        if re.search(r"@\s*-", self.text):
            raise self.refuse("@ modifier", "a negative @ time is not supported", r"@")
        when = getattr(modifier, "at", None)
        if not isinstance(when, datetime):
            raise self.refuse("@ modifier", "its time could not be read", r"@")
        micros = (when - _EPOCH) // timedelta(microseconds=1)
        return int(math.copysign(math.floor(abs(micros) / 1000 + 0.5), micros))

    def subquery(self, expr: pp.SubqueryExpr) -> Subquery:
        at = self.at(expr.at)
        self.pinned += at is not None
        try:
            inner = self.node(expr.expr)
        finally:
            self.pinned -= at is not None
        if inner.kind != "vector":
            raise self.refuse("subquery", f"a subquery needs an instant vector, got a {inner.kind}",
                              r"\[[^\]]*:[^\]]*\]")
        step = _ms(expr.step) if expr.step is not None else 0
        offset = _ms(expr.offset) if expr.offset is not None else 0
        return Subquery(inner, _ms(expr.range) if expr.range is not None else 0, step, offset, at)

    def selector(self, sel: pp.VectorSelector, at: object, offset_delta: timedelta | None) -> Selector:
        if sel.matchers.or_matchers:
            raise self.refuse("or inside a selector", "or-joined matchers are not supported", r"\bor\b")
        matchers = []
        for m in sel.matchers.matchers:
            op = _match_op(m.op)
            regex = None
            if op in ("=~", "!~"):
                try:
                    regex = re.compile(m.value, re.DOTALL)
                except re.error as err:
                    raise self.refuse("regex matcher", f"regex {m.value!r} does not compile: {err}",
                                      re.escape(m.value)) from err
            matchers.append(Matcher(m.name, op, m.value, regex))  # type: ignore[arg-type]
        offset = _ms(offset_delta) if offset_delta is not None else 0
        return Selector(sel.name, tuple(matchers), offset, self.at(at))

    def call(self, call: pp.Call) -> Node:
        name = call.func.name
        pattern = rf"\b{re.escape(name)}\s*\("
        if name not in FUNCTIONS:
            raise self.refuse(f"function {name}()", f"this function is not supported ({SUBSET_SUMMARY})",
                              pattern)
        kinds = FUNCTIONS[name]
        args = tuple(self.node(a) for a in call.args)
        if name == "vector" and not args:
            raise self.refuse(f"function {name}()", "needs one argument", pattern)
        for arg, want in zip(args, kinds + kinds[-1:] * len(args), strict=False):
            have = {"scalar": "s", "vector": "v", "matrix": "m", "string": "t"}[arg.kind]
            if have != want:
                names = {"s": "scalar", "v": "instant vector", "m": "range vector", "t": "string"}
                raise self.refuse(f"function {name}()", f"an argument is a {arg.kind}, expected "
                                  f"{names[want]}", pattern)
        if name in ("label_replace", "label_join"):
            self.check_label_args(name, args, pattern)
        kind = "scalar" if name in SCALAR_FUNCTIONS else "vector"
        return Call(name, args, kind=kind)  # type: ignore[arg-type]

    def check_label_args(self, name: str, args: tuple[Node, ...], pattern: str) -> None:
        """Refuse at load time what Prometheus refuses when the function first runs."""
        texts = [a.value for a in args[1:] if isinstance(a, String)]
        label_names = [texts[0]] + (texts[2:] if name == "label_join" else [])
        for label in label_names:
            if not LABEL_NAME.fullmatch(label):
                raise self.refuse(f"function {name}()", f"invalid label name {label!r}", pattern)
        if name == "label_replace":
            try:
                re.compile(texts[3])
            except re.error as err:
                raise self.refuse(f"function {name}()", f"regex {texts[3]!r} does not compile: {err}",
                                  pattern) from err

    def aggregate(self, agg: pp.AggregateExpr) -> Aggregate:
        op = str(agg.op)
        if op not in AGGREGATIONS:
            raise self.refuse(f"aggregation {op}", f"this aggregation is not supported ({SUBSET_SUMMARY})",
                              rf"\b{re.escape(op)}\b")
        param = None
        if agg.param is not None:
            param = self.node(agg.param)
            want = "string" if op == "count_values" else "scalar"
            if param.kind != want:
                raise self.refuse(f"aggregation {op}", f"its parameter must be a {want}",
                                  rf"\b{re.escape(op)}\b")
            if isinstance(param, String) and not LABEL_NAME.fullmatch(param.value):
                raise self.refuse(f"aggregation {op}", f"invalid label name {param.value!r}",
                                  rf"\b{re.escape(op)}\b")
        inner = self.node(agg.expr)
        if inner.kind != "vector":
            raise self.refuse(f"aggregation {op}", f"it needs an instant vector, got a {inner.kind}",
                              rf"\b{re.escape(op)}\b")
        grouping: tuple[str, ...] = ()
        without = False
        if agg.modifier is not None:
            grouping = tuple(agg.modifier.labels)
            without = agg.modifier.type == pp.AggModifierType.Without
        return Aggregate(op, inner, param, grouping, without)

    def binary(self, expr: pp.BinaryExpr) -> Node:
        op = str(expr.op)
        if op not in BINARY_OPS:
            raise self.refuse(f"operator {op}", "this operator is not supported", re.escape(op))
        lhs, rhs = self.node(expr.lhs), self.node(expr.rhs)
        for side in (lhs, rhs):
            if side.kind == "matrix":
                raise self.refuse(f"operator {op}", "a range vector cannot be an operand", re.escape(op))
        mod = expr.modifier
        return_bool = bool(mod and mod.return_bool)
        if lhs.kind == "scalar" and rhs.kind == "scalar":
            return Binary(op, lhs, rhs, return_bool, kind="scalar")
        card = "one-to-one"
        on = False
        matching: tuple[str, ...] = ()
        include: tuple[str, ...] = ()
        if mod is not None:
            card = _cardinality(mod.card)
            if mod.matching is not None:
                on = mod.matching.type == pp.LabelModifierType.Include
                matching = tuple(mod.matching.labels)
            include = tuple(mod.group_labels or ())
            fill = getattr(mod, "fill_values", None)
            if fill is not None and (fill.lhs is not None or fill.rhs is not None):
                raise self.refuse("fill modifier", "fill values are not supported", r"\bfill")
        if op in SET_OPS:
            card = "many-to-many"
        return Binary(op, lhs, rhs, return_bool, card, on, matching, include)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def parse_expr(text: str) -> Node:
    """Parse and convert an expression; raises UnsupportedExpression for anything outside the subset."""
    try:
        tree = pp.parse(text)
    except (ValueError, RuntimeError, TypeError) as err:
        raise UnsupportedExpression(text, "syntax", str(err)) from err
    return _Converter(text).node(tree)


def check_supported(expr: str) -> None:
    """Raise UnsupportedExpression when the embedded evaluator cannot evaluate ``expr``."""
    parse_expr(expr)
