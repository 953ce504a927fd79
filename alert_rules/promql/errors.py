"""Errors of the PromQL subset: refused at build time, or failed at evaluation time."""

from __future__ import annotations

from exporters.errors import InferwatchError


class UnsupportedExpression(InferwatchError, ValueError):  # noqa: N818 (agreed interface name)
    """An expression does not parse, or uses a construct outside the embedded evaluator's subset.

    Attributes:
        expr: the expression text.
        construct: the refused construct (e.g. ``function topk``), or ``syntax`` for a parse error.
        position: 0-based character offset of the construct in ``expr``, or None if unknown.
    """

    def __init__(self, expr: str, construct: str, problem: str, position: int | None = None) -> None:
        self.expr = expr
        self.construct = construct
        self.position = position
        where = ""
        if position is not None:
            line = expr.count("\n", 0, position) + 1
            column = position - (expr.rfind("\n", 0, position) + 1) + 1
            where = f" at line {line}, column {column} (offset {position})"
        super().__init__(f"PromQL {construct}{where}: {problem}; in expression {expr!r}")


class EvaluationError(InferwatchError, RuntimeError):
    """An expression failed at evaluation time, as Prometheus would fail it (e.g. duplicate series)."""
