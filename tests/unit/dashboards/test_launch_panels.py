"""The SLO board's fast-retry and 32k-class panels and its slowest-requests table (issues 28 §3 and 29 §2-3)."""

from __future__ import annotations

from typing import Any

import pytest

from alert_rules.config import RulesConfig
from alert_rules.render import alerts
from dashboards import explain
from dashboards.build import dashboards, datasources
from dashboards.config import DashboardConfig
from dashboards.lint import lint
from exporters.catalog import request
from exporters.configuring import from_mapping
from exporters.explain import ROW_FIELDS

SLO = "inferwatch-slo.json"
BASE = "http://sidecar:9100"


def _panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in board["panels"] if p["title"].startswith(title))


def _with_base(base: str = BASE + "/") -> DashboardConfig:
    config: DashboardConfig = from_mapping(DashboardConfig, {"explain_base_url": base}, "dashboards")
    return config


def test_fast_retries_are_on_the_traffic_row() -> None:
    """The fast-retry counter, as a rate per model, next to the traffic it adds to."""
    board = dashboards(DashboardConfig(), RulesConfig())[SLO]
    panel = _panel(board, "Fast retries")
    traffic_row = next(p for p in board["panels"] if p["title"] == "Traffic and errors")
    assert panel["gridPos"]["y"] > traffic_row["gridPos"]["y"]
    [target] = panel["targets"]
    assert f"rate({request.FAST_RETRIES.series}{{" in target["expr"]
    assert target["expr"].startswith("sum by (model_name)")
    assert "500 ms" in panel["description"]
    assert "serve.fast_retry_window_ms" in panel["description"]


@pytest.mark.parametrize(("edges", "bucket"), [((512, 4096, 16384, 32768), "16k-32k"),
                                               ((1024, 8192, 32000, 65536), "8k-32000")])
def test_the_32k_panel_draws_the_alerts_class_and_threshold(edges: tuple[int, ...], bucket: str) -> None:
    """The 32k panel selects the class InferwatchContext32kFailures selects and draws its threshold, whatever the
    edges and the ratio are: both come from the rule's own definition."""
    rules = from_mapping(RulesConfig, {"context_32k_error_ratio": 0.07}, "rules")
    rule = next(a for a in alerts(rules, edges) if a.name == "InferwatchContext32kFailures")
    assert f'length_bucket="{bucket}"' in rule.expr
    assert rule.expr.endswith("> 0.07")
    panel = _panel(dashboards(DashboardConfig(), rules, edges)[SLO], "32k class")
    assert bucket in panel["title"]
    assert [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.07]
    failed, refused = panel["targets"]
    assert all(f'length_bucket="{bucket}"' in t["expr"] for t in (failed, refused))
    assert 'outcome=~"upstream_error|timeout|overloaded"' in failed["expr"]
    assert 'outcome=~"client_error"' in refused["expr"]


def test_the_slowest_requests_table_needs_the_explain_base_url() -> None:
    """Without dashboards.explain_base_url no table and no Infinity data source; with it, both."""
    panels = dashboards(DashboardConfig(), RulesConfig())[SLO]["panels"]
    assert not any(p["title"] == "Slowest requests" for p in panels)
    assert [d["type"] for d in datasources(DashboardConfig())["datasources"]] == ["prometheus", "jaeger"]
    *_, sidecar = datasources(_with_base())["datasources"]
    assert (sidecar["type"], sidecar["uid"]) == (explain.INFINITY_TYPE, explain.INFINITY_UID)
    assert sidecar["jsonData"]["allowedHosts"] == [BASE]
    assert "secureJsonData" not in sidecar


def test_the_sidecar_datasource_sends_the_admin_token_from_its_file() -> None:
    """With dashboards.explain_token_file, Grafana sends the file's token as the bearer token of /admin."""
    config = from_mapping(DashboardConfig, {"explain_base_url": BASE, "explain_token_file": "/run/secrets/admin"},
                          "dashboards")
    *_, sidecar = datasources(config)["datasources"]
    assert sidecar["jsonData"]["auth_method"] == "bearerToken"
    assert sidecar["secureJsonData"] == {"bearerToken": "$__file{/run/secrets/admin}"}


def test_the_slowest_requests_table_reads_the_sidecar_and_links_each_trace() -> None:
    """The table GETs BASE/admin/requests for the board's range through the provisioned Infinity data source, shows
    fields every /admin/requests row has, and links each trace id to BASE/admin/requests/TRACE_ID; it passes the
    lint."""
    board = dashboards(_with_base(), RulesConfig())[SLO]
    panel = _panel(board, "Slowest requests")
    assert panel["datasource"] == {"type": explain.INFINITY_TYPE, "uid": explain.INFINITY_UID}
    [target] = panel["targets"]
    assert target["url"] == f"{BASE}/admin/requests?slowest={explain.SLOWEST_ROWS}&from=${{__from}}"
    assert target["root_selector"] == "requests"
    assert {c["selector"] for c in target["columns"]} <= {*ROW_FIELDS, "cause"}
    [link_override] = [o for o in panel["fieldConfig"]["overrides"]
                       if any(p["id"] == "links" for p in o["properties"])]
    assert link_override["matcher"]["options"] == next(c["text"] for c in target["columns"]
                                                       if c["selector"] == "trace_id")
    [link] = link_override["properties"][0]["value"]
    assert link["url"] == f"{BASE}/admin/requests/${{__value.raw}}"
    assert [str(f) for f in lint(board)] == []


def test_the_lint_refuses_an_infinity_table_without_a_link() -> None:
    """An Infinity panel whose data link is gone, or whose target is not a JSON GET, is a lint finding."""
    board = dashboards(_with_base(), RulesConfig())[SLO]
    panel = _panel(board, "Slowest requests")
    panel["fieldConfig"]["overrides"] = []
    panel["targets"][0]["url_options"]["method"] = "POST"
    found = [f.message for f in lint(board) if f.rule == "infinity-target-rule"]
    assert len(found) == 2
