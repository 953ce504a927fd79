"""One evaluation step of rule groups, with Prometheus 2.42's alert lifecycle.

The evaluation time is an argument: no clock or scheduler lives here. Recording-rule outputs
and the ``ALERTS`` / ``ALERTS_FOR_STATE`` series are written back into the store, with stale
markers when a series stops being produced, as Prometheus does. Alert state (pending, firing,
resolved-but-still-reported) can be saved to and restored from a JSON-able dict.

Group ``interval:`` is honoured (a group is evaluated when due), without Prometheus' per-group
offset; the promtool runner instead evaluates every group at the test file's interval, as
promtool does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from alert_rules import notify
from alert_rules.promql.ast import Node
from alert_rules.promql.errors import EvaluationError, UnsupportedExpression
from alert_rules.promql.evaluate import DEFAULT_LOOKBACK_MS, Evaluator
from alert_rules.promql.parse import parse_expr
from alert_rules.promql.shared import Shared, share
from alert_rules.promql.template import TemplateData, TemplateError, check_template, expand
from alert_rules.promql.values import NAME, STALE_NAN, Labels, labels_of
from alert_rules.store import SeriesStore
from exporters.errors import InferwatchError

RESOLVED_RETENTION_MS = 15 * 60 * 1000
"""A resolved alert is still reported (as resolved) for this long, like Prometheus."""

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
          "y": 31_536_000_000}


class RuleFileError(InferwatchError, ValueError):
    """A rule group document is malformed (missing keys, bad durations, refused expressions)."""


def parse_duration_ms(text: str | int | float | None, where: str = "duration") -> int:
    """A Prometheus duration (``1h30m``, ``15s``, ``0``) in milliseconds."""
    if text is None or text in ("", 0):
        return 0
    if isinstance(text, int | float):
        raise RuleFileError(f"{where}: {text!r} is not a duration string like 5m")
    total, rest = 0, str(text).strip()
    parts = re.findall(r"(\d+)(ms|[smhdwy])", rest)
    if not parts or "".join(n + u for n, u in parts) != rest:
        if rest == "0":
            return 0
        raise RuleFileError(f"{where}: {text!r} is not a duration like 30s, 5m or 1h30m")
    for number, unit in parts:
        total += int(number) * _UNITS[unit]
    return total


@dataclass(frozen=True, slots=True)
class RecordingRule:
    """``record: name`` with its expression and extra labels."""

    record: str
    expr: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AlertingRule:
    """``alert: name`` with its expression, hold durations, labels and annotations."""

    alert: str
    expr: str
    for_ms: int = 0
    keep_firing_for_ms: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


Rule = RecordingRule | AlertingRule


@dataclass(frozen=True, slots=True)
class RuleGroup:
    """A named list of rules evaluated in order."""

    name: str
    rules: tuple[Rule, ...]
    interval_ms: int | None = None


def load_groups(document: Mapping[str, Any], source: str = "rules") -> list[RuleGroup]:
    """Validate a rule-file document (``{"groups": [...]}``) and check every expression and template."""
    if not isinstance(document, Mapping) or not isinstance(document.get("groups"), list):
        raise RuleFileError(f"{source}: expected a mapping with a 'groups' list")
    groups = []
    seen_groups: set[str] = set()
    for gi, raw in enumerate(document["groups"]):
        where = f"{source}: groups[{gi}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise RuleFileError(f"{where}: each group needs a 'name'")
        if raw["name"] in seen_groups:
            raise RuleFileError(f"{where}: group name {raw['name']!r} is used twice")
        seen_groups.add(raw["name"])
        unknown = set(raw) - {"name", "interval", "rules", "limit"}
        if unknown:
            raise RuleFileError(f"{where}: unknown keys {sorted(unknown)}")
        interval = parse_duration_ms(raw["interval"], f"{where}.interval") if raw.get("interval") else None
        rules = tuple(_load_rule(r, f"{where}.rules[{ri}]") for ri, r in enumerate(raw.get("rules") or []))
        groups.append(RuleGroup(raw["name"], rules, interval))
    return groups


def _strings(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise RuleFileError(f"{where}: expected a mapping of strings")
    return {k: v if isinstance(v, str) else str(v) for k, v in value.items()}


def _load_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("expr"), str | int | float):
        raise RuleFileError(f"{where}: each rule needs an 'expr'")
    expr = str(raw["expr"])
    try:
        parse_expr(expr)
    except UnsupportedExpression as err:
        named = f"alert {raw['alert']!r}" if "alert" in raw else f"record {raw.get('record')!r}"
        raise RuleFileError(f"{where} ({named}): {err}") from err
    labels = _strings(raw.get("labels"), f"{where}.labels")
    if "record" in raw:
        unknown = set(raw) - {"record", "expr", "labels"}
        if unknown:
            raise RuleFileError(f"{where}: unknown keys {sorted(unknown)} in a recording rule")
        return RecordingRule(str(raw["record"]), expr, labels)
    if "alert" not in raw:
        raise RuleFileError(f"{where}: a rule needs 'record' or 'alert'")
    unknown = set(raw) - {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
    if unknown:
        raise RuleFileError(f"{where}: unknown keys {sorted(unknown)} in an alerting rule")
    annotations = _strings(raw.get("annotations"), f"{where}.annotations")
    for key, text in {**labels, **annotations}.items():
        try:
            check_template(text)
        except TemplateError as err:
            raise RuleFileError(f"{where}: template of {key!r}: {err}") from err
    return AlertingRule(
        str(raw["alert"]), expr,
        parse_duration_ms(raw.get("for"), f"{where}.for"),
        parse_duration_ms(raw.get("keep_firing_for"), f"{where}.keep_firing_for"),
        labels, annotations,
    )


@dataclass(slots=True)
class Alert:
    """One active alert instance (Prometheus' rules.Alert)."""

    labels: Labels
    annotations: dict[str, str]
    state: str  # "pending" | "firing" | "inactive"
    active_at_ms: int
    value: float
    fired_at_ms: int | None = None
    resolved_at_ms: int | None = None
    last_sent_ms: int | None = None
    valid_until_ms: int | None = None
    keep_firing_since_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form for the state file."""
        data = {k: getattr(self, k) for k in self.__slots__}
        data["labels"] = dict(self.labels)
        data["value"] = None if math.isnan(self.value) else self.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Alert:
        """Inverse of :meth:`to_json`."""
        values = dict(data)
        values["labels"] = labels_of(values["labels"])
        values["value"] = math.nan if values.get("value") is None else float(values["value"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert changed state at ``at_ms`` (for ``rules eval`` and logs)."""

    alert: str
    labels: Labels
    state: str  # "pending" | "firing" | "resolved"
    at_ms: int


@dataclass(slots=True)
class StepResult:
    """What one evaluation produced."""

    transitions: list[Transition] = field(default_factory=list)
    to_send: list[notify.Notification] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class RuleEngine:
    """Evaluates rule groups over a :class:`SeriesStore` and tracks alert state."""

    def __init__(self, groups: Sequence[RuleGroup], store: SeriesStore, *,
                 default_interval_ms: int = 15_000, lookback_ms: int = DEFAULT_LOOKBACK_MS,
                 recorded_retention_ms: int | None = None, resend_delay_ms: int = 60_000,
                 external_labels: Mapping[str, str] | None = None, external_url: str = "") -> None:
        self.groups = list(groups)
        self.store = store
        self._trees, shared = self._parse_all()
        # a subquery without a step uses the global evaluation interval, as in Prometheus
        self.evaluator = Evaluator(store, lookback_ms, shared, subquery_step_ms=default_interval_ms)
        self.default_interval_ms = default_interval_ms
        self.recorded_retention_ms = recorded_retention_ms
        self.resend_delay_ms = resend_delay_ms
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        self.active: dict[str, dict[Labels, Alert]] = {}
        self.last_eval_ms: dict[str, int] = {}
        self._previous: dict[tuple[str, int], set[Labels]] = {}

    def _parse_all(self) -> tuple[dict[tuple[str, int], tuple[str, Node]], Shared]:
        """(group, rule index) -> (expression, tree), with subtrees repeated across rules made one
        object, and those subtrees (see :mod:`alert_rules.promql.shared`)."""
        keys: list[tuple[str, int]] = []
        texts: list[str] = []
        for group in self.groups:
            for index, rule in enumerate(group.rules):
                try:
                    parse_expr(rule.expr)
                except (UnsupportedExpression, ValueError):
                    continue  # reported by each evaluation, as before
                keys.append((group.name, index))
                texts.append(rule.expr)
        trees, shared = share([parse_expr(text) for text in texts])
        return {key: (text, tree) for key, text, tree in zip(keys, texts, trees, strict=True)}, shared

    # scheduling

    def interval_of(self, group: RuleGroup) -> int:
        """The group's own interval, or the engine's default."""
        return group.interval_ms or self.default_interval_ms

    def evaluate_due(self, t_ms: int) -> StepResult:
        """Evaluate every group whose interval has elapsed since its last evaluation."""
        result = StepResult()
        for group in self.groups:
            last = self.last_eval_ms.get(group.name)
            if last is None or t_ms - last >= self.interval_of(group):
                self.evaluate_group(group, t_ms, result)
        return result

    def evaluate_all(self, t_ms: int, order: Sequence[str] | None = None) -> StepResult:
        """Evaluate every group now (promtool's behaviour), optionally in a given group order."""
        result = StepResult()
        groups = self.groups
        if order:
            rank = {name: i for i, name in enumerate(order)}
            groups = sorted(groups, key=lambda g: rank.get(g.name, len(rank)))
        for group in groups:
            self.evaluate_group(group, t_ms, result)
        return result

    # evaluation

    def evaluate_group(self, group: RuleGroup, t_ms: int, result: StepResult | None = None) -> StepResult:
        """Evaluate one group's rules in order at ``t_ms``."""
        result = result if result is not None else StepResult()
        self.last_eval_ms[group.name] = t_ms
        interval = self.interval_of(group)
        for index, rule in enumerate(group.rules):
            parsed = self._trees.get((group.name, index))
            expr: str | Node = parsed[1] if parsed is not None and parsed[0] == rule.expr else rule.expr
            try:
                if isinstance(rule, RecordingRule):
                    produced = self._record(rule, expr, t_ms)
                else:
                    produced = self._alert(rule, expr, t_ms, result)
                    result.to_send.extend(self._sendable(rule, t_ms, interval))
            except (EvaluationError, ArithmeticError, ValueError) as err:
                result.errors.append(f"group {group.name!r} rule {index} "
                                     f"({getattr(rule, 'record', None) or getattr(rule, 'alert', '')}): {err}")
                produced = set()
            self._write_stale(group.name, index, produced, t_ms)
        return result

    def _query(self, expr: str | Node, t_ms: int) -> list[tuple[Labels, float]]:
        value = self.evaluator.query(expr, t_ms)
        if isinstance(value, float):
            return [((), value)]
        return value

    def _record(self, rule: RecordingRule, expr: str | Node, t_ms: int) -> set[Labels]:
        out: list[tuple[Labels, float]] = []
        for labels, value in self._query(expr, t_ms):
            mapping = dict(labels)
            mapping[NAME] = rule.record
            mapping.update(rule.labels)
            out.append((labels_of(mapping), value))
        produced = {labels for labels, _ in out}
        if len(produced) != len(out):
            raise EvaluationError("vector contains metrics with the same labelset after applying rule labels")
        for labels, value in out:
            self.store.append(labels, t_ms, value, self.recorded_retention_ms)
        return produced

    def _alert(self, rule: AlertingRule, expr: str | Node, t_ms: int, result: StepResult) -> set[Labels]:
        fresh: dict[Labels, Alert] = {}
        for labels, value in self._query(expr, t_ms):
            base = {k: v for k, v in labels if k != NAME}
            data = TemplateData(base, value, self.external_labels, self.external_url,
                                query=lambda text: self._query(text, t_ms))
            mapping = dict(base)
            for name, text in rule.labels.items():
                mapping[name] = expand(text, data)
            mapping["alertname"] = rule.alert
            alert_labels = labels_of(mapping)
            if alert_labels in fresh:
                raise EvaluationError("vector contains metrics with the same labelset after applying "
                                      "alert labels")
            annotations = {k: expand(v, data) for k, v in rule.annotations.items()}
            fresh[alert_labels] = Alert(alert_labels, annotations, "pending", t_ms, value)
        active = self.active.setdefault(rule.alert, {})
        for key, alert in fresh.items():
            known = active.get(key)
            if known is not None and known.state != "inactive":
                known.value = alert.value
                known.annotations = alert.annotations
                continue
            active[key] = alert
            result.transitions.append(Transition(rule.alert, key, "pending", t_ms))
        produced: set[Labels] = set()
        for key, alert in list(active.items()):
            if key not in fresh:
                keep_firing = False
                if alert.state == "firing" and rule.keep_firing_for_ms > 0:
                    if alert.keep_firing_since_ms is None:
                        alert.keep_firing_since_ms = t_ms
                    if t_ms - alert.keep_firing_since_ms < rule.keep_firing_for_ms:
                        keep_firing = True
                if alert.state == "pending" or (
                    alert.resolved_at_ms is not None and t_ms - alert.resolved_at_ms > RESOLVED_RETENTION_MS
                ):
                    del active[key]
                if alert.state != "inactive" and not keep_firing:
                    result.transitions.append(Transition(
                        rule.alert, key, "resolved" if alert.state == "firing" else "inactive", t_ms))
                    alert.state = "inactive"
                    alert.resolved_at_ms = t_ms
                if not keep_firing:
                    continue
            else:
                alert.keep_firing_since_ms = None
            if alert.state == "pending" and t_ms - alert.active_at_ms >= rule.for_ms:
                alert.state = "firing"
                alert.fired_at_ms = t_ms
                result.transitions.append(Transition(rule.alert, key, "firing", t_ms))
            produced.update(self._write_alert_series(alert, t_ms))
        return produced

    def _write_alert_series(self, alert: Alert, t_ms: int) -> list[Labels]:
        mapping = dict(alert.labels)
        series = labels_of({**mapping, NAME: "ALERTS", "alertstate": alert.state})
        for_state = labels_of({**mapping, NAME: "ALERTS_FOR_STATE"})
        self.store.append(series, t_ms, 1.0, self.recorded_retention_ms)
        self.store.append(for_state, t_ms, float(alert.active_at_ms // 1000), self.recorded_retention_ms)
        return [series, for_state]

    def _write_stale(self, group: str, index: int, produced: set[Labels], t_ms: int) -> None:
        key = (group, index)
        for labels in self._previous.get(key, set()) - produced:
            self.store.append(labels, t_ms, STALE_NAN)
        self._previous[key] = produced

    def _sendable(self, rule: AlertingRule, t_ms: int, interval_ms: int) -> list[notify.Notification]:
        out = []
        for alert in self.active.get(rule.alert, {}).values():
            if notify.needs_sending(alert.state, alert.resolved_at_ms, alert.last_sent_ms, t_ms,
                                    self.resend_delay_ms):
                alert.last_sent_ms = t_ms
                alert.valid_until_ms = t_ms + 4 * max(self.resend_delay_ms, interval_ms)
                out.append(notify.Notification(
                    labels=dict(alert.labels), annotations=dict(alert.annotations),
                    starts_at_ms=alert.fired_at_ms if alert.fired_at_ms is not None else alert.active_at_ms,
                    ends_at_ms=alert.resolved_at_ms if alert.resolved_at_ms is not None
                    else alert.valid_until_ms,
                    expr=rule.expr,
                ))
        return out

    # queries on state

    def firing(self, alertname: str | None = None) -> list[Alert]:
        """Alerts currently firing (optionally of one rule)."""
        names = [alertname] if alertname else list(self.active)
        return [a for n in names for a in self.active.get(n, {}).values() if a.state == "firing"]

    def alerts(self) -> list[Alert]:
        """Every alert held (pending, firing, or resolved within the retention)."""
        return [a for per_rule in self.active.values() for a in per_rule.values()]

    # persistence

    def state(self) -> dict[str, Any]:
        """Alert state as a JSON-able dict (see :meth:`restore`)."""
        return {
            "version": 1,
            "alerts": {name: [a.to_json() for a in per_rule.values()] for name, per_rule in self.active.items()},
            "last_eval_ms": dict(self.last_eval_ms),
        }

    def restore(self, state: Mapping[str, Any], now_ms: int, max_age_ms: int) -> int:
        """Load alert state saved by :meth:`state`; alerts of unknown rules or too old are dropped.

        Returns how many alerts were restored. A firing alert keeps its ``fired_at`` and
        ``last_sent``, so it is neither re-paged nor resent before its resend delay.
        """
        if state.get("version") != 1:
            raise RuleFileError("alert state file: unknown version")
        known = {r.alert for g in self.groups for r in g.rules if isinstance(r, AlertingRule)}
        restored = 0
        for name, items in (state.get("alerts") or {}).items():
            if name not in known:
                continue
            for item in items:
                alert = Alert.from_json(item)
                newest = max(t for t in (alert.active_at_ms, alert.fired_at_ms, alert.last_sent_ms,
                                         alert.resolved_at_ms) if t is not None)
                if now_ms - newest > max_age_ms:
                    continue
                self.active.setdefault(name, {})[alert.labels] = alert
                restored += 1
        return restored
