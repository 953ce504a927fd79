"""Common subexpressions of a rule set: equal subtrees made one object, so one evaluation can reuse a result.

Rules built from the same templates repeat whole subqueries (``sum by (model_name, le)
(rate(..._bucket[5m]))`` feeds two alerts). :func:`share` rebuilds the trees so that equal
subtrees are the same object, and names those occurring more than once together with the metric
names they read; the evaluator reuses such a subtree's result while the time and those series
are unchanged (see :class:`alert_rules.promql.evaluate.Evaluator`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from alert_rules.promql.ast import Node, Number, RangeSelector, Selector

AnyName = None
"""Stands for "every metric name" when a selector names none (``{job="x"}``)."""

Reads = frozenset[str] | None
"""The metric names a subtree reads; None when it may read any."""

Shared = dict[int, tuple[Node, Reads]]
"""``id(subtree) -> (subtree, names it reads)``; holding the subtree keeps its id from being reused."""


def share(trees: Sequence[Node]) -> tuple[list[Node], Shared]:
    """The trees with equal subtrees as one object, and the subtrees occurring more than once.

    Only subtrees that read series are listed (a number is cheaper to recompute than to look up).
    """
    canonical: dict[Node, Node] = {}
    uses: Counter[int] = Counter()
    out = [_intern(tree, canonical, uses) for tree in trees]
    by_id = {id(node): node for node in canonical.values()}
    shared: Shared = {}
    for node_id, count in uses.items():
        node = by_id[node_id]
        if count > 1 and not isinstance(node, Number | RangeSelector):
            names = reads(node)
            if names is None or names:
                shared[node_id] = (node, names)
    return out, shared


def reads(node: Node) -> Reads:
    """Metric names a subtree selects; None when a selector has no name."""
    if isinstance(node, Selector):
        return AnyName if node.name is None else frozenset({node.name})
    names: set[str] = set()
    for child in _children(node):
        found = reads(child)
        if found is None:
            return AnyName
        names |= found
    return frozenset(names)


def _children(node: Node) -> list[Node]:
    out: list[Node] = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, tuple):
            out.extend(v for v in value if _is_node(v))
        elif _is_node(value):
            out.append(value)
    return out


def _is_node(value: object) -> bool:
    return dataclasses.is_dataclass(value) and hasattr(value, "kind")


def _intern(node: Node, canonical: dict[Node, Node], uses: Counter[int]) -> Node:
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, tuple) and any(_is_node(v) for v in value):
            changes[f.name] = tuple(_intern(v, canonical, uses) if _is_node(v) else v for v in value)
        elif _is_node(value):
            changes[f.name] = _intern(value, canonical, uses)
    rebuilt = dataclasses.replace(node, **changes) if changes else node
    found = canonical.setdefault(rebuilt, rebuilt)
    uses[id(found)] += 1
    return found
