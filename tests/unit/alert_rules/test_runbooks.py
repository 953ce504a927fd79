"""docs/runbooks.md: an entry per alert with its meaning, first checks and interventions."""

from __future__ import annotations

import pytest

from alert_rules import render, runbooks
from alert_rules.config import RulesConfig

EDGES = (512, 2048, 8192, 32768)


def test_every_alert_has_a_runbook_entry() -> None:
    """The markdown has a heading per alert and the alert's runbook anchor resolves to it."""
    alerts = render.alerts(RulesConfig(), EDGES)
    text = runbooks.runbooks_markdown(RulesConfig(), alerts)
    for alert in alerts:
        assert f"\n## {alert.name}\n" in text
        assert f"(#{alert.runbook_anchor})" in text


def test_entries_name_the_interventions_of_the_issue() -> None:
    """Across the runbooks: lower max-num-seqs, fp8 KV cache, a separate queue, shed load, roll back."""
    text = runbooks.runbooks_markdown(RulesConfig(), render.alerts(RulesConfig(), EDGES))
    for phrase in ("--max-num-seqs", "fp8", "separate queue", "Shed load", "Roll back"):
        assert phrase in text


def test_each_entry_has_checks_and_interventions() -> None:
    """No runbook is empty: each has a meaning, a check and an intervention."""
    for name, book in runbooks.RUNBOOKS.items():
        assert book.meaning, name
        assert book.checks, name
        assert book.interventions, name


def test_an_alert_without_runbook_is_refused() -> None:
    """Generating the runbooks fails for an alert that has none."""
    alert = render.alerts(RulesConfig(), EDGES)[0]
    stranger = type(alert)(name="InferwatchStranger", expr="vector(1)", severity=alert.severity,
                           summary="A stranger.", description="Nobody wrote its runbook.")
    with pytest.raises(KeyError, match="InferwatchStranger"):
        runbooks.runbooks_markdown(RulesConfig(), (stranger,))
