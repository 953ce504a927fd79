"""Boards to JSON files with sorted keys and stable uids, plus Grafana provisioning files.

grafanalib writes the schema-12 model with legacy keys; :func:`render` drops those keys and the
nulls, and stamps the schema version the panels are written for, so Grafana runs only the
migrations that newer versions add.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from grafanalib._gen import DashboardEncoder

from alert_rules.config import RulesConfig
from dashboards import explain
from dashboards.boards import BOARDS
from dashboards.config import DashboardConfig
from exporters.files import write_atomic
from exporters.records import DEFAULT_LENGTH_EDGES

SCHEMA_VERSION = 39
"""The dashboard model the panels are written for (Grafana 10.4–11)."""
LEGACY_KEYS = ("__inputs", "rows", "hideControls", "sharedCrosshair", "style", "gnetId", "id")
PANEL_LEGACY_KEYS = ("error", "span", "minSpan", "height", "repeatDirection", "maxPerRow", "cacheTimeout")


def _drop_nulls(value: Any) -> Any:
    """Remove None values from dicts (a threshold step's base ``value`` stays null)."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None or k == "value"}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _clean_panel(panel: dict[str, Any]) -> dict[str, Any]:
    for key in PANEL_LEGACY_KEYS:
        panel.pop(key, None)
    if panel.get("type") == "row":
        for key in ("targets", "fieldConfig", "datasource", "links", "transformations", "description"):
            panel.pop(key, None)
    for child in panel.get("panels", []):
        _clean_panel(child)
    return panel


def render(board: Any) -> dict[str, Any]:
    """One grafanalib dashboard as the JSON-ready dict written to disk."""
    data: dict[str, Any] = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    for key in LEGACY_KEYS:
        data.pop(key, None)
    data["schemaVersion"] = SCHEMA_VERSION
    data["panels"] = [_clean_panel(p) for p in data.get("panels", [])]
    result: dict[str, Any] = _drop_nulls(data)
    return result


def dashboards(config: DashboardConfig, rules: RulesConfig,
               length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON, for every board (``length_edges``: serve.length_bucket_edges)."""
    out = {}
    for module in BOARDS.values():
        data = render(module.build(config, rules, length_edges))
        out[f"{data['uid']}.json"] = data
    return out


def explain_link(config: DashboardConfig) -> list[dict[str, str]]:
    """The exemplar destination that opens the sidecar's explanation of the request (none without a base URL)."""
    if not config.explain_base_url:
        return []
    return [{"name": config.exemplar_label, "url": explain.request_url(config),
             "urlDisplayLabel": "Explain this request"}]


def sidecar_datasource(config: DashboardConfig) -> list[dict[str, Any]]:
    """The Infinity data source the slowest-requests table reads the sidecar's ``/admin/requests`` through, allowed
    to reach the explain base URL only, with the admin bearer token when a token file is configured (none without
    a base URL)."""
    if not config.explain_base_url:
        return []
    source: dict[str, Any] = {
        "name": "inferwatch sidecar", "type": explain.INFINITY_TYPE, "uid": explain.INFINITY_UID, "access": "proxy",
        "editable": False, "jsonData": {"allowedHosts": [explain.base_url(config)]},
    }
    if config.explain_token_file:  # the /admin bearer token, which Grafana reads from the file when it starts
        source["jsonData"]["auth_method"] = "bearerToken"
        source["secureJsonData"] = {"bearerToken": f"$__file{{{config.explain_token_file}}}"}
    return [source]


def datasources(config: DashboardConfig) -> dict[str, Any]:
    """Grafana datasource provisioning: Prometheus with exemplar links into the trace datasource, the trace
    datasource, and with an explain base URL the Infinity datasource of the slowest-requests table."""
    prometheus = {
        "name": config.datasource_name, "type": "prometheus", "uid": config.datasource_uid, "access": "proxy",
        "url": config.prometheus_url, "isDefault": True, "editable": False,
        "jsonData": {
            "httpMethod": "POST",
            "exemplarTraceIdDestinations": [
                {"name": config.exemplar_label, "datasourceUid": config.trace_datasource_uid},
                *explain_link(config),
            ],
        },
    }
    traces = {
        "name": config.trace_backend.capitalize(), "type": config.trace_backend,
        "uid": config.trace_datasource_uid, "access": "proxy", "url": config.trace_url, "editable": False,
    }
    return {"apiVersion": 1, "datasources": [prometheus, traces, *sidecar_datasource(config)]}


def provider(config: DashboardConfig) -> dict[str, Any]:
    """Grafana dashboard provider: read-only boards from ``grafana_dashboards_path``."""
    return {"apiVersion": 1, "providers": [{
        "name": config.uid_prefix, "orgId": 1, "folder": config.folder, "type": "file",
        "disableDeletion": True, "editable": False, "allowUiUpdates": False, "updateIntervalSeconds": 30,
        "options": {"path": config.grafana_dashboards_path, "foldersFromFilesStructure": False},
    }]}


def files(config: DashboardConfig, rules: RulesConfig,
          length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> dict[str, str]:
    """Relative path -> file text of everything ``dashboards build`` writes."""
    out = {
        f"dashboards/{name}": json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, data in dashboards(config, rules, length_edges).items()
    }
    out["provisioning/datasources/inferwatch.yaml"] = yaml.safe_dump(
        datasources(config), sort_keys=True, default_flow_style=False)
    out["provisioning/dashboards/inferwatch.yaml"] = yaml.safe_dump(
        provider(config), sort_keys=True, default_flow_style=False)
    return out


def write(out_dir: str | Path, config: DashboardConfig, rules: RulesConfig,
          length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> list[Path]:
    """Write every file under ``out_dir`` (each atomically) and return their paths."""
    root = Path(out_dir)
    written = []
    for rel, text in files(config, rules, length_edges).items():
        path = root / rel
        write_atomic(path, text)
        written.append(path)
    return written


__all__ = ["SCHEMA_VERSION", "dashboards", "datasources", "files", "provider", "render", "sidecar_datasource",
           "write"]
