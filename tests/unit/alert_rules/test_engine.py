"""Tests of the rule engine's lifecycle, recording rules and state file."""

from __future__ import annotations

import pytest

from alert_rules.engine import RuleEngine, RuleFileError, load_groups
from alert_rules.promql.values import labels_of
from alert_rules.store import SeriesStore

MIN = 60_000
DOC = {"groups": [{"name": "g", "rules": [
    {"record": "job:x:double", "expr": "x * 2"},
    {"alert": "High", "expr": "job:x:double > 10", "for": "2m", "keep_firing_for": "2m",
     "labels": {"severity": "critical"}, "annotations": {"summary": "value {{ $value }}"}},
]}]}


def run(values: list[float], until: int) -> tuple[RuleEngine, list[tuple[int, str]]]:
    """Feed x one value a minute and evaluate every minute; returns (engine, transitions)."""
    store = SeriesStore()
    engine = RuleEngine(load_groups(DOC), store, default_interval_ms=MIN)
    seen = []
    for minute in range(until + 1):
        if minute < len(values):
            store.append(labels_of({"__name__": "x"}), minute * MIN, values[minute])
        seen += [(minute, t.state) for t in engine.evaluate_all(minute * MIN).transitions]
    return engine, seen


def test_for_and_keep_firing_for() -> None:
    """Pending at the first true evaluation, firing after `for`, kept for keep_firing_for, then resolved."""
    engine, seen = run([1, 6, 6, 6, 6, 1, 1, 1, 1], 8)
    assert seen == [(1, "pending"), (3, "firing"), (7, "resolved")]
    assert engine.active["High"][next(iter(engine.active["High"]))].state == "inactive"


def test_one_false_evaluation_resets_pending() -> None:
    """A pending alert whose expression goes false once starts over."""
    _, seen = run([6, 6, 1, 6, 6, 6], 5)
    assert seen == [(0, "pending"), (2, "inactive"), (3, "pending"), (5, "firing")]


def test_annotations_and_notifications() -> None:
    """A firing alert is sent with its templated annotation, startsAt = the time it fired."""
    store = SeriesStore()
    engine = RuleEngine(load_groups(DOC), store, default_interval_ms=MIN)
    sent = []
    for minute in range(4):
        store.append(labels_of({"__name__": "x"}), minute * MIN, 6.0)
        sent += engine.evaluate_all(minute * MIN).to_send
    assert len(sent) == 1
    assert sent[0].annotations == {"summary": "value 12"}
    assert sent[0].starts_at_ms == 2 * MIN


def test_restart_restores_firing_without_new_page() -> None:
    """State saved and restored keeps the alert firing with its start time, and nothing is re-sent at once."""
    store = SeriesStore()
    engine = RuleEngine(load_groups(DOC), store, default_interval_ms=MIN)
    for minute in range(3):
        store.append(labels_of({"__name__": "x"}), minute * MIN, 6.0)
        engine.evaluate_all(minute * MIN)
    state = engine.state()
    again = RuleEngine(load_groups(DOC), store, default_interval_ms=MIN)
    assert again.restore(state, 3 * MIN, 3600_000) == 1
    store.append(labels_of({"__name__": "x"}), 3 * MIN, 6.0)
    step = again.evaluate_all(3 * MIN)
    assert step.transitions == []
    assert step.to_send == []
    assert again.firing("High")[0].fired_at_ms == 2 * MIN


def test_recording_output_goes_stale_when_gone() -> None:
    """A recording rule's series disappears at once when its expression stops returning it."""
    store = SeriesStore()
    engine = RuleEngine(load_groups(DOC), store, default_interval_ms=MIN)
    store.append(labels_of({"__name__": "x"}), 0, 1.0)
    engine.evaluate_all(0)
    engine.evaluate_all(6 * MIN)
    assert engine.evaluator.query("job:x:double", 6 * MIN + 1000) == []


def test_bad_rules_are_refused() -> None:
    """Unknown keys and unsupported expressions are rule-file errors."""
    with pytest.raises(RuleFileError, match=r"rules\[0\] \(alert 'A'\): PromQL syntax.*holt_winters"):
        load_groups({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "holt_winters(x[5m], 0.5, 0.5)"}]}]})
    with pytest.raises(RuleFileError, match=r"\(record 'r'\): PromQL @ modifier .*negative"):
        load_groups({"groups": [{"name": "g", "rules": [{"record": "r", "expr": "x @ -5"}]}]})
    with pytest.raises(RuleFileError):
        load_groups({"groups": [{"name": "g", "rules": [{"record": "r", "expr": "x", "for": "1m"}]}]})


def test_shared_subquery_sees_a_series_recorded_between_its_uses() -> None:
    """A subquery repeated before and after the rule recording what it reads is evaluated afresh."""
    doc = {"groups": [{"name": "g", "rules": [
        {"alert": "Before", "expr": "sum(rec) >= 0"},
        {"record": "rec", "expr": "sum(x)"},
        {"alert": "After", "expr": "sum(rec) >= 0"},
    ]}]}
    store = SeriesStore()
    engine = RuleEngine(load_groups(doc), store, default_interval_ms=MIN)
    store.append(labels_of({"__name__": "x"}), 0, 1.0)
    seen = {t.alert for t in engine.evaluate_all(0).transitions}
    assert seen == {"After"}
    seen = {t.alert for t in engine.evaluate_all(MIN).transitions}
    assert seen == {"Before"}
