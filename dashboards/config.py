"""Configuration section owned by the dashboards."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configuring import setting


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """Section ``[dashboards]``: Grafana boards."""

    uid_prefix: str = setting("inferwatch", "Prefix of every dashboard uid.")
