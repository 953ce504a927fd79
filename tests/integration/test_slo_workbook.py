"""The SRE workbook's detection times (alerting.md §8.4) reproduced by the generated SLO page.

A 99.9 % availability SLO over 30 days, 10 requests/s, 6 hours of clean traffic (so every page
window is full), then a constant error ratio from T0 on. The page must fire within one evaluation
interval of the workbook's detection time (51.84 s at 100 %, 518.4 s at 10 %), and never at 0.5 %.
Checked with promtool and with ``inferwatch rules eval``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alert_rules.build import write_all
from alert_rules.spec import duration, selector
from alert_rules.windows import PAGE_FAST, detection_time_s
from exporters.catalog.request import REQUESTS
from serving.config import defaults

pytestmark = pytest.mark.real_server

ALERT = "InferwatchAvailabilityBudgetBurnPage"
STEP_S = 5  # input samples every 5 s (the sidecar's scrape interval)
EVAL_S = int(defaults().rules.evaluation_interval_s)  # 15 s, the rules' evaluation interval
T0 = 6 * 3600  # errors start here; before it, 6 h of clean traffic fill the 6h window
PER_STEP = 50  # 10 requests/s
MODEL = "workbook"


def _input_series(error_ratio: float, after_s: int) -> list[dict[str, str]]:
    """OK and error counters: clean until T0, then ``error_ratio`` of the traffic fails."""
    before, after = T0 // STEP_S, after_s // STEP_S
    bad, ok = PER_STEP * error_ratio, PER_STEP * (1 - error_ratio)
    base = (("model_name", "=", MODEL), ("route", "=", "/v1/completions"), ("length_bucket", "=", "le512"))
    return [
        {"series": selector(REQUESTS.series, *base, ("outcome", "=", "ok")),
         "values": f"0+{PER_STEP}x{before} {PER_STEP * before + ok:g}+{ok:g}x{after}"},
        {"series": selector(REQUESTS.series, *base, ("outcome", "=", "upstream_error")),
         "values": f"0x{before} {bad:g}+{bad:g}x{after}"},
    ]


def _expected_labels() -> dict[str, str]:
    return {"model_name": MODEL, "service": "vllm", "severity": "critical", "slo": "availability"}


@pytest.fixture(scope="module", name="rules_dir")
def _rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built")
    write_all(defaults(), out)
    return out


def _floor_to(t: float, step: int) -> int:
    return math.floor(t / step) * step


def _ceil_to(t: float, step: int) -> int:
    return math.ceil(t / step) * step


def _promtool_file(rules_dir: Path, error_ratio: float) -> Path:
    detect = detection_time_s(PAGE_FAST, 0.999, 30, error_ratio)
    assert detect is not None
    # Firing at F with F - detect in (-EVAL_S, +EVAL_S]: absent at the last evaluation at or before
    # detect - EVAL_S, firing from the first evaluation at or after detect + EVAL_S.
    absent_at = T0 + _floor_to(detect - EVAL_S, EVAL_S)
    firing_at = T0 + _ceil_to(detect + EVAL_S, EVAL_S)
    alerts = yaml.safe_load((rules_dir / "rules" / "slo.yml").read_text())
    page = next(r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    annotations = {k: v.replace("{{ $labels.model_name }}", MODEL) for k, v in page["annotations"].items()}
    expected = [{"exp_labels": _expected_labels(), "exp_annotations": annotations}]
    doc: dict[str, Any] = {
        "rule_files": ["rules/slo.yml"],
        "evaluation_interval": duration(EVAL_S),
        "tests": [{
            "name": f"{error_ratio:.0%} errors page within one evaluation of {detect:g} s",
            "interval": duration(STEP_S),
            "input_series": _input_series(error_ratio, firing_at - T0 + 60),
            "alert_rule_test": [
                {"eval_time": duration(T0), "alertname": ALERT, "exp_alerts": []},
                {"eval_time": duration(absent_at), "alertname": ALERT, "exp_alerts": []},
                {"eval_time": duration(firing_at), "alertname": ALERT, "exp_alerts": expected},
            ],
        }],
    }
    path = rules_dir / f"workbook_{int(error_ratio * 1000)}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _never_pages_file(rules_dir: Path) -> Path:
    checks = [{"eval_time": duration(T0 + m * 60), "alertname": ALERT, "exp_alerts": []} for m in (10, 60, 120)]
    doc = {
        "rule_files": ["rules/slo.yml"],
        "evaluation_interval": duration(EVAL_S),
        "tests": [{"name": "0.5 % errors never page", "interval": duration(STEP_S),
                   "input_series": _input_series(0.005, 7200 + 60), "alert_rule_test": checks}],
    }
    path = rules_dir / "workbook_never.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("error_ratio", [1.0, 0.1], ids=["100 % errors", "10 % errors"])
def test_promtool_pages_at_the_workbook_detection_time(rules_dir: Path, promtool: Path, error_ratio: float) -> None:
    """Under promtool, the page fires within one evaluation interval of 51.84 s or 518.4 s."""
    path = _promtool_file(rules_dir, error_ratio)
    result = subprocess.run([str(promtool), "test", "rules", path.name], cwd=rules_dir, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_never_pages_at_half_a_percent(rules_dir: Path, promtool: Path) -> None:
    """Under promtool, 0.5 % errors (below both page thresholds) never page."""
    path = _never_pages_file(rules_dir)
    result = subprocess.run([str(promtool), "test", "rules", path.name], cwd=rules_dir, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _eval_firing_times(tmp_path: Path, error_ratio: float, after_s: int) -> list[float]:
    series = tmp_path / "series.yml"
    series.write_text(yaml.safe_dump({"interval": duration(STEP_S),
                                      "input_series": _input_series(error_ratio, after_s)}))
    result = subprocess.run(
        [sys.executable, "-m", "serving.cli", "rules", "eval", "--series", str(series), "--start", "0s",
         "--end", duration(T0 + after_s), "--step", duration(EVAL_S), "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return [e["at"] for e in events if e["alert"] == ALERT and e["state"] == "firing"
            and e["labels"].get("model_name") == MODEL]


@pytest.mark.parametrize("error_ratio", [1.0, 0.1], ids=["100 % errors", "10 % errors"])
def test_embedded_evaluator_pages_at_the_workbook_detection_time(tmp_path: Path, error_ratio: float) -> None:
    """inferwatch rules eval fires the page within one evaluation interval of the workbook's time."""
    detect = detection_time_s(PAGE_FAST, 0.999, 30, error_ratio)
    assert detect is not None
    firing = _eval_firing_times(tmp_path, error_ratio, int(detect) + 4 * EVAL_S)
    assert firing, "the page never fired"
    assert abs(firing[0] - (T0 + detect)) <= EVAL_S


def test_embedded_evaluator_never_pages_at_half_a_percent(tmp_path: Path) -> None:
    """inferwatch rules eval never fires the page at 0.5 % errors."""
    assert _eval_firing_times(tmp_path, 0.005, 3600) == []
