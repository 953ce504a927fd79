"""The generated Alertmanager configuration."""

from __future__ import annotations

from alert_rules.alertmanager import alertmanager_config
from alert_rules.config import RulesConfig


def test_routes_by_severity_to_page_ticket_and_info() -> None:
    """critical goes to page, warning to ticket, info to info."""
    routes = alertmanager_config(RulesConfig())["route"]["routes"]
    assert [(r["matchers"], r["receiver"]) for r in routes] == [
        (['severity="critical"'], "page"), (['severity="warning"'], "ticket"), (['severity="info"'], "info"),
    ]


def test_rollback_inhibits_degrade_for_the_same_model() -> None:
    """The inhibition names both actions and compares service and model_name."""
    (rule,) = alertmanager_config(RulesConfig())["inhibit_rules"]
    assert rule == {
        "source_matchers": ['action="rollback"'], "target_matchers": ['action="degrade"'],
        "equal": ["service", "model_name"],
    }


def test_receivers_are_webhooks_by_default_and_silent_when_empty() -> None:
    """A configured URL becomes a webhook with send_resolved; an empty one a receiver without configs."""
    config = RulesConfig(alertmanager_receivers={"page": "http://127.0.0.1:1/p", "ticket": "", "info": ""})
    receivers = {r["name"]: r for r in alertmanager_config(config)["receivers"]}
    assert receivers["page"]["webhook_configs"] == [{"url": "http://127.0.0.1:1/p", "send_resolved": True}]
    assert receivers["ticket"] == {"name": "ticket"}


def test_timings_come_from_the_config() -> None:
    """group_wait, group_interval and repeat_interval are configurable."""
    route = alertmanager_config(RulesConfig(alertmanager_group_wait_s=1, alertmanager_group_interval_s=2))["route"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == ("1s", "2s", "4h")
