"""The evaluator's own expression tree: only the supported subset can be represented."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

ValueKind = Literal["scalar", "vector", "matrix", "string"]

At = int | Literal["start", "end"] | None
"""An ``@`` modifier: a time in milliseconds, ``start()`` or ``end()`` (both the query's time in a rule), or none."""


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher; regexes are anchored like Prometheus' (full match)."""

    name: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False)

    def matches(self, value: str) -> bool:
        """True when a label value (``''`` for a missing label) satisfies the matcher."""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self.regex is not None
        hit = self.regex.fullmatch(value) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True, slots=True)
class Number:
    """A number literal."""

    value: float
    kind: ValueKind = "scalar"


@dataclass(frozen=True, slots=True)
class Selector:
    """An instant vector selector (``name{matchers} offset d``)."""

    name: str | None
    matchers: tuple[Matcher, ...]
    offset_ms: int = 0
    at: At = None
    kind: ValueKind = "vector"


@dataclass(frozen=True, slots=True)
class RangeSelector:
    """A range vector selector (``selector[range]``)."""

    selector: Selector
    range_ms: int
    kind: ValueKind = "matrix"


@dataclass(frozen=True, slots=True)
class Subquery:
    """``expr[range:step] offset d @ t``; a step of 0 stands for the default (the evaluation interval)."""

    expr: Node
    range_ms: int
    step_ms: int
    offset_ms: int = 0
    at: At = None
    kind: ValueKind = "matrix"


@dataclass(frozen=True, slots=True)
class String:
    """A string literal (only as an argument of label_replace, label_join and count_values)."""

    value: str
    kind: ValueKind = "string"


@dataclass(frozen=True, slots=True)
class Call:
    """A function call."""

    func: str
    args: tuple[Node, ...]
    kind: ValueKind = "vector"


@dataclass(frozen=True, slots=True)
class Aggregate:
    """``op [by|without (labels)] ([param,] expr)``."""

    op: str
    expr: Node
    param: Node | None
    grouping: tuple[str, ...]
    without: bool
    kind: ValueKind = "vector"


@dataclass(frozen=True, slots=True)
class Binary:
    """A binary operation with its vector-matching modifiers."""

    op: str
    lhs: Node
    rhs: Node
    return_bool: bool = False
    card: Literal["one-to-one", "many-to-one", "one-to-many", "many-to-many"] = "one-to-one"
    on: bool = False
    matching: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    kind: ValueKind = "vector"


@dataclass(frozen=True, slots=True)
class Negate:
    """Unary minus."""

    expr: Node
    kind: ValueKind = "vector"


Node = Number | String | Selector | RangeSelector | Subquery | Call | Aggregate | Binary | Negate
MatrixNode = RangeSelector | Subquery
"""What a range-vector argument may be."""
