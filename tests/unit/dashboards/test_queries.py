"""Every query parses as PromQL and reads only metric names that really exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from alert_rules import slo, tenant_slo
from alert_rules.config import RulesConfig
from alert_rules.windows import windows_used
from dashboards.lint import expand, metric_names
from exporters.catalog import prometheus as external
from exporters.catalog import sample_names
from exporters.catalog import vllm as vllm_catalog

DATA = Path(__file__).resolve().parents[2] / "data"
VLLM_EXPOSITION = DATA / "vllm_v1_engine_0.32.prom"
METRIC_LIKE = re.compile(r"\b(?:vllm:\w+|inferwatch_\w+|prometheus_\w+_(?:total|seconds)|ALERTS\b)")
PROMETHEUS_EXPOSITION = Path(__file__).parent / "data" / "prometheus_2.42_self.prom"


def exposed_names(path: Path) -> set[str]:
    """Sample names present in a captured /metrics text."""
    names = set()
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def recorded_names() -> set[str]:
    """Series the built SLO recording rules produce (the model-wide and the per-tenant ones)."""
    rules = (*slo.recording_rules(RulesConfig()), *tenant_slo.recording_rules(RulesConfig()))
    return {r.record for r in rules}


def all_exprs(boards: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(board/panel, expression) for every target of every panel."""
    out = []
    for name, data in boards.items():
        for panel in data["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{name}/{panel['title']}", target["expr"]))
    return out


def test_every_query_parses(boards: dict[str, dict[str, Any]]) -> None:
    """Each expression parses with promql-parser once Grafana variables are substituted."""
    exprs = all_exprs(boards)
    assert len(exprs) > 100
    for where, expr in exprs:
        try:
            promql_parser.parse(expand(expr))
        except (ValueError, RuntimeError) as err:
            pytest.fail(f"{where}: {err}: {expr}")


def test_every_metric_name_exists(boards: dict[str, dict[str, Any]]) -> None:
    """Each name is in the catalog, the real vLLM 0.32 capture, the rules' recordings or Prometheus' own."""
    vllm_real = exposed_names(VLLM_EXPOSITION)
    prometheus_real = exposed_names(PROMETHEUS_EXPOSITION)
    synthetic = {s.series for s in external.SYNTHETIC}
    known_sidecar = sample_names()
    unknown = []
    for where, expr in all_exprs(boards):
        for name in metric_names(expr):
            if name.startswith("vllm:"):
                ok = name in vllm_real
            elif name.startswith("inferwatch:"):
                ok = name in recorded_names()
            elif name.startswith("inferwatch_"):
                ok = name in known_sidecar
            else:
                ok = name in prometheus_real or name in synthetic
            if not ok:
                unknown.append(f"{where}: {name}")
    assert unknown == []


def test_external_series_are_declared_with_real_names() -> None:
    """Every non-synthetic Prometheus series declared for the boards is in the real 2.42 exposition."""
    real = exposed_names(PROMETHEUS_EXPOSITION)
    declared = [s.series for s in external.SPECS if s not in external.SYNTHETIC]
    assert [name for name in declared if name not in real] == []


def test_every_vllm_family_is_on_a_board(boards: dict[str, dict[str, Any]]) -> None:
    """All 39 families of vLLM 0.32 are read by some panel, the 13 that public boards miss included."""
    used = {name for _, expr in all_exprs(boards) for name in metric_names(expr)}
    missing = [s.name for s in vllm_catalog.CURRENT_FAMILIES if not set(s.sample_names()) & used]
    assert len(vllm_catalog.CURRENT_FAMILIES) == 39
    assert missing == []
    for spec in (vllm_catalog.REQUEST_NUM_PREEMPTIONS, vllm_catalog.ADMISSION_REJECTIONS,
                 vllm_catalog.PROMPT_TOKENS_CACHED):
        assert set(spec.sample_names()) & used


def test_burn_rates_cover_every_alert_window(boards: dict[str, dict[str, Any]]) -> None:
    """The burn-rate panel reads the recorded error ratio of every window the burn alerts use."""
    used = {name for _, expr in all_exprs(boards) for name in metric_names(expr)}
    assert {slo.error_ratio_name(w) for w in windows_used()} <= used


def test_no_metric_name_is_spelled_in_the_dashboards_source() -> None:
    """Outside external.py no string literal of the dashboards package holds a metric name."""
    root = Path(__file__).resolve().parents[3] / "dashboards"
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "external.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                offenders += [f"{path.name}: {m}" for m in METRIC_LIKE.findall(node.value)]
    assert offenders == []
