"""Configuration section owned by the alert rules: every threshold lives here."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configuring import positive, setting


@dataclass(frozen=True, slots=True)
class RulesConfig:
    """Section ``[rules]``: thresholds and windows of the alerts and SLOs."""

    evaluation_interval_s: float = setting(
        15.0, "Seconds between evaluations of the embedded rule engine.", check=positive
    )
