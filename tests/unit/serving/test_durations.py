"""One duration parser: alert_rules.engine.parse_duration_ms, also behind the ages of ``logs cat --since``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from alert_rules.engine import parse_duration_ms
from serving.commands.logs import parse_time

ROOT = Path(__file__).resolve().parents[3]
NOW_S = 1_800_000_000.0


@pytest.mark.parametrize("age", ["15m", "2h", "7d", "1h30m", "90s", "1w"])
def test_an_age_is_now_minus_the_prometheus_duration(age: str) -> None:
    """An age (``--since 1h30m``) lies exactly the rule files' duration before now."""
    assert parse_time(age, now=NOW_S) == round(NOW_S * 1000) - parse_duration_ms(age)


@pytest.mark.parametrize(("text", "epoch_ms"), [("0", 0), ("1700000000.5", 1_700_000_000_500),
                                                ("2026-08-07T12:00:00Z", 1_786_104_000_000)])
def test_unix_seconds_and_iso_times_are_not_ages(text: str, epoch_ms: int) -> None:
    """Unix seconds (``0`` included: the epoch, not zero seconds ago) and ISO 8601 times stay times."""
    assert parse_time(text, now=NOW_S) == epoch_ms


@pytest.mark.parametrize("text", ["15x", "m15", "1.5h", "yesterday"])
def test_anything_else_is_refused_naming_the_forms(text: str) -> None:
    """Not a time: argparse's error, naming the three forms."""
    with pytest.raises(argparse.ArgumentTypeError, match="an age"):
        parse_time(text, now=NOW_S)


def test_no_other_module_parses_duration_units() -> None:
    """One parser: no package module but alert_rules/engine.py holds a regex over duration units."""
    unit_regex = re.compile(r"""\[s?m?h?d[wy]*\]|\(ms\|""")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("serving", "exporters", "alert_rules", "dashboards", "log_pipeline")
        for path in (ROOT / package).rglob("*.py")
        if path != ROOT / "alert_rules" / "engine.py" and unit_regex.search(path.read_text())
    ]
    assert offenders == []
