"""The Alertmanager configuration: routes by severity, the circuit-breaker inhibition, webhook receivers."""

from __future__ import annotations

from typing import Any

from alert_rules.config import RulesConfig
from alert_rules.spec import Severity, duration

RECEIVER_OF: dict[Severity, str] = {
    Severity.CRITICAL: "page",
    Severity.WARNING: "ticket",
    Severity.INFO: "info",
}
"""critical pages on-call, warning opens a ticket, info is advice: never a page."""

GROUP_BY = ("alertname", "service", "model_name")
INHIBIT_EQUAL = ("service", "model_name")


def _receiver(name: str, url: str) -> dict[str, Any]:
    if not url:
        return {"name": name}  # a receiver without configs is valid: it drops what it gets
    return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}


def alertmanager_config(config: RulesConfig) -> dict[str, Any]:
    """The ``alertmanager.yml`` structure.

    Rollback (critical, ``action="rollback"``) inhibits degrade (``action="degrade"``) for the
    same service and model. Both sides name their ``action`` so that no alert can match both,
    and ``equal`` names labels every breaker alert carries (a label missing on both sides would
    count as equal).
    """
    routes = [
        {"matchers": [f'severity="{severity}"'], "receiver": receiver}
        for severity, receiver in RECEIVER_OF.items()
    ]
    return {
        "route": {
            "receiver": "info",
            "group_by": list(GROUP_BY),
            "group_wait": duration(config.alertmanager_group_wait_s),
            "group_interval": duration(config.alertmanager_group_interval_s),
            "repeat_interval": duration(config.alertmanager_repeat_interval_s),
            "routes": routes,
        },
        "inhibit_rules": [{
            "source_matchers": ['action="rollback"'],
            "target_matchers": ['action="degrade"'],
            "equal": list(INHIBIT_EQUAL),
        }],
        "receivers": [
            _receiver(name, config.alertmanager_receivers.get(name, ""))
            for name in ("page", "ticket", "info")
        ],
    }


__all__ = ["GROUP_BY", "INHIBIT_EQUAL", "RECEIVER_OF", "alertmanager_config"]
