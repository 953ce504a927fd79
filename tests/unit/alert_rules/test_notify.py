"""Tests of Alertmanager payloads and resend decisions."""

from __future__ import annotations

import json

from alert_rules.notify import Notification, alertmanager_body, needs_sending, rfc3339


def test_resend_rules_follow_prometheus() -> None:
    """Pending never sends; firing sends first, then after the resend delay; a resolution at once."""
    assert not needs_sending("pending", None, None, 0, 60_000)
    assert needs_sending("firing", None, None, 0, 60_000)
    assert not needs_sending("firing", None, 0, 60_000, 60_000)
    assert needs_sending("firing", None, 0, 60_001, 60_000)
    assert needs_sending("inactive", 30_000, 0, 30_000, 60_000)


def test_payload_shape() -> None:
    """The body is a JSON array with string labels, RFC 3339 times and external labels underneath."""
    item = Notification({"alertname": "A", "severity": "critical"}, {"summary": "s"}, 1_000, 5_000, "x > 1")
    [alert] = json.loads(alertmanager_body([item], {"site": "lab", "severity": "ignored"}))
    assert alert["labels"] == {"alertname": "A", "severity": "critical", "site": "lab"}
    assert alert["startsAt"] == "1970-01-01T00:00:01.000Z"
    assert alert["endsAt"] == rfc3339(5_000)
    assert "g0.expr=x%20%3E%201" in alert["generatorURL"]
