"""Shared fixtures of the dashboard tests: the rendered boards with default configs."""

from __future__ import annotations

from typing import Any

import pytest

from alert_rules.config import RulesConfig
from dashboards.build import dashboards
from dashboards.config import DashboardConfig


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    """File name -> rendered dashboard JSON, with every default."""
    return dashboards(DashboardConfig(), RulesConfig())
