"""Rules as values: recording rules, alerting rules and the groups that hold them."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alert_rules.config import RulesConfig

_ALERT_NAME = re.compile(r"^Inferwatch[A-Z][A-Za-z0-9]*$")
_RECORD_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class Severity(enum.StrEnum):
    """How urgent an alert is: critical pages, warning opens a ticket, info is advice."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


def duration(seconds: float) -> str:
    """A Prometheus duration string for a whole number of seconds, e.g. 3600 -> ``1h``."""
    total = round(seconds)
    if total != seconds or total < 0:
        raise ValueError(f"a rule duration must be a whole number of seconds, got {seconds!r}")
    if total == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def number(value: float) -> str:
    """A float literal for PromQL that reads back as exactly the same float."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


@dataclass(frozen=True, slots=True)
class RecordingRule:
    """A recording rule: ``record`` is the name its results are stored under."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _RECORD_NAME.match(self.record):
            raise ValueError(f"recording rule name {self.record!r} is not a valid metric name")

    def to_dict(self) -> dict[str, Any]:
        """The rule as it appears in a Prometheus rule file."""
        out: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(sorted(self.labels.items()))
        return out


@dataclass(frozen=True, slots=True)
class Runbook:
    """The text of one runbook entry, given with its alert (``AlertRule.runbook``); none may be empty."""

    meaning: str
    checks: tuple[str, ...]
    interventions: tuple[str, ...]

    def __post_init__(self) -> None:
        if not (self.meaning and self.checks and self.interventions and all(self.checks)
                and all(self.interventions)):
            raise ValueError(f"a runbook needs a meaning, checks and interventions, got {self!r}")


@dataclass(frozen=True, slots=True)
class Series:
    """One promtool input series: a selector and its expanding-notation values."""

    series: str
    values: str

    def to_dict(self) -> dict[str, str]:
        """The series as promtool reads it."""
        return {"series": self.series, "values": self.values}


@dataclass(frozen=True, slots=True)
class Case:
    """A further promtool test of an alert: its inputs, and the labels it fires with (None: it stays quiet).

    For alerts with several conditions, one case per condition made false shows each one matters.
    """

    name: str
    inputs: tuple[Series, ...]
    fires_with: dict[str, str] | None = None
    active_at_s: int | None = None
    """When the case's expression would turn true (None: the scenario's ``active_at_s``); checked at that plus
    the alert's ``for``."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """Inputs that make an alert's expression true from ``active_at_s``, and inputs that keep it false.

    ``false_from_s``: the first evaluation at which the firing inputs make the expression false
    again (needed to test ``keep_firing_for``). ``cases``: further tests, checked at the firing time.
    """

    step_s: int
    firing: tuple[Series, ...]
    quiet: tuple[Series, ...]
    active_at_s: int
    labels: dict[str, str] = field(default_factory=dict)
    false_from_s: int | None = None
    cases: tuple[Case, ...] = ()


ScenarioBuilder = Callable[["RulesConfig", "AlertRule", tuple[int, ...]], Scenario]
"""``(config, alert, length bucket edges) -> scenario``; called only when the tests are written."""


@dataclass(frozen=True, slots=True)
class AlertRule:
    """An alerting rule with everything on-call needs, and its test: one definition per alert.

    ``runbook`` (what it means, what to check, how to intervene) and ``scenario`` (the promtool
    inputs that make it fire and keep it quiet) are required, so an alert cannot exist without
    either. Neither appears in the rule file.
    """

    name: str
    expr: str
    severity: Severity
    summary: str
    description: str
    runbook: Runbook = field(repr=False)
    scenario: ScenarioBuilder = field(repr=False)
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ALERT_NAME.match(self.name):
            raise ValueError(f"alert name {self.name!r} must be CamelCase and start with 'Inferwatch'")
        if not self.summary.endswith("."):
            raise ValueError(f"alert {self.name}: the summary must be one sentence ending with a period")
        duration(self.for_s)
        duration(self.keep_firing_for_s)

    @property
    def runbook_anchor(self) -> str:
        """The anchor of this alert's entry in docs/runbooks.md (GitHub heading style)."""
        return self.name.lower()

    @property
    def all_labels(self) -> dict[str, str]:
        """The rule's static labels, severity included, sorted by name."""
        return dict(sorted({**self.labels, "severity": str(self.severity)}.items()))

    @property
    def all_annotations(self) -> dict[str, str]:
        """summary, description and any extra annotations, sorted by name."""
        merged = {**self.annotations, "summary": self.summary, "description": self.description}
        return dict(sorted(merged.items()))

    def to_dict(self) -> dict[str, Any]:
        """The rule as it appears in a Prometheus rule file."""
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_s:
            out["for"] = duration(self.for_s)
        if self.keep_firing_for_s:
            out["keep_firing_for"] = duration(self.keep_firing_for_s)
        out["labels"] = self.all_labels
        out["annotations"] = self.all_annotations
        return out


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(name: str, *matchers: tuple[str, str, str]) -> str:
    """A PromQL selector: ``selector("m", ("le", "=", "1.0"))`` -> ``m{le="1.0"}``."""
    if not matchers:
        return name
    body = ", ".join(f"{label}{op}{_quote(value)}" for label, op, value in matchers)
    return f"{name}{{{body}}}"


def any_of(values: tuple[str, ...] | list[str]) -> str:
    """A regex matching exactly one of some plain label values (letters, digits, ``_``, ``-``, ``/``)."""
    for value in values:
        if not re.fullmatch(r"[A-Za-z0-9_\-/]+", value):
            raise ValueError(f"label value {value!r} is not plain enough to put in a regex unescaped")
    return "|".join(values)


Rule = RecordingRule | AlertRule


@dataclass(frozen=True, slots=True)
class RuleGroup:
    """A named, ordered list of rules evaluated together at one interval."""

    name: str
    rules: tuple[Rule, ...]
    interval_s: float | None = None
    file: str = "rules"

    def alerts(self) -> tuple[AlertRule, ...]:
        """The alerting rules of the group, in order."""
        return tuple(r for r in self.rules if isinstance(r, AlertRule))

    def to_dict(self) -> dict[str, Any]:
        """The group as it appears in a Prometheus rule file."""
        out: dict[str, Any] = {"name": self.name}
        if self.interval_s:
            out["interval"] = duration(self.interval_s)
        out["rules"] = [rule.to_dict() for rule in self.rules]
        return out


__all__ = [
    "AlertRule", "RecordingRule", "Rule", "RuleGroup", "Severity", "any_of", "duration", "number", "selector",
]
