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


@pytest.mark.parametrize(
    ("meaning", "checks", "interventions"),
    [("", ("a",), ("b",)), ("m", (), ("b",)), ("m", ("a",), ()), ("m", ("",), ("b",))],
    ids=["no meaning", "no check", "no intervention", "an empty check"],
)
def test_an_empty_runbook_is_refused(meaning: str, checks: tuple[str, ...], interventions: tuple[str, ...]) -> None:
    """A runbook without a meaning, a check or an intervention cannot be written down."""
    with pytest.raises(ValueError, match="runbook needs"):
        runbooks.Runbook(meaning, checks, interventions)


def test_an_alert_without_runbook_cannot_be_defined() -> None:
    """The runbook is a required field of the alert, so leaving it out fails where the alert is written."""
    alert = render.alerts(RulesConfig(), EDGES)[0]
    with pytest.raises(TypeError, match="runbook"):
        type(alert)(name="InferwatchStranger", expr="vector(1)", severity=alert.severity,  # type: ignore[call-arg]
                    summary="A stranger.", description="Nobody wrote its runbook.", scenario=alert.scenario)
