"""Tests of common-subexpression sharing and of the evaluator's reuse of shared results."""

from __future__ import annotations

from collections.abc import Sequence

from alert_rules.promql import Evaluator, parse_expr
from alert_rules.promql.ast import Binary, Matcher
from alert_rules.promql.shared import reads, share
from alert_rules.promql.values import labels_of
from alert_rules.store import SeriesStore

MIN = 60_000


class CountingStore(SeriesStore):
    """A store that counts the range reads rate() makes."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def increases(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int, maxt_ms: int,
                  counter: bool) -> list[tuple[tuple[tuple[str, str], ...], int, int, int, float, float]]:
        """Count, then read."""
        self.reads += 1
        return super().increases(name, matchers, mint_ms, maxt_ms, counter)


def counter_store() -> CountingStore:
    """x rising by 60 a minute for 10 minutes."""
    store = CountingStore()
    for minute in range(10):
        store.append(labels_of({"__name__": "x", "m": "a"}), minute * MIN, minute * 60.0)
    return store


def test_equal_subtrees_become_one_object() -> None:
    """A subquery written in two rules is one object afterwards, listed with the names it reads."""
    trees, shared = share([parse_expr("sum(rate(x[5m])) > 1"), parse_expr("sum(rate(x[5m])) < 5"),
                           parse_expr("y > 1")])
    first, second = trees[0], trees[1]
    assert isinstance(first, Binary)
    assert isinstance(second, Binary)
    assert first.lhs is second.lhs
    assert shared[id(first.lhs)] == (first.lhs, frozenset({"x"}))
    assert id(first.rhs) not in shared
    assert id(trees[2]) not in shared


def test_a_selector_without_name_reads_every_name() -> None:
    """A nameless selector may read any series, so any write invalidates a result built on it."""
    assert reads(parse_expr('sum({job="a"}) + sum(x)')) is None
    assert reads(parse_expr("sum(x) + rate(y[1m])")) == frozenset({"x", "y"})


def test_shared_result_is_reused_until_time_or_series_change() -> None:
    """The evaluator reads the store once per time for a shared subtree, again after a write to it."""
    store = counter_store()
    trees, shared = share([parse_expr("sum(rate(x[5m])) > 0"), parse_expr("sum(rate(x[5m])) < 100")])
    evaluator = Evaluator(store, shared=shared)
    assert [v for _, v in evaluator.query(trees[0], 9 * MIN)] == [1.0]
    assert [v for _, v in evaluator.query(trees[1], 9 * MIN)] == [1.0]
    assert store.reads == 1
    store.append(labels_of({"__name__": "other"}), 9 * MIN, 1.0)
    evaluator.query(trees[1], 9 * MIN)
    assert store.reads == 1
    store.append(labels_of({"__name__": "x", "m": "a"}), 9 * MIN + 1, 600.0)
    evaluator.query(trees[1], 9 * MIN)
    assert store.reads == 2
    evaluator.query(trees[1], 9 * MIN + 15_000)
    assert store.reads == 3


def test_without_sharing_every_query_reads_the_store() -> None:
    """A plain evaluator keeps nothing between queries."""
    store = counter_store()
    evaluator = Evaluator(store)
    evaluator.query("sum(rate(x[5m])) > 0", 9 * MIN)
    evaluator.query("sum(rate(x[5m])) > 0", 9 * MIN)
    assert store.reads == 2
