"""Configuration section owned by the dashboards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporters.configuring import http_url, one_of, positive, setting

TRACE_BACKENDS = ("jaeger", "tempo")


def _uid_part(value: Any) -> str | None:
    if not value or len(value) > 24 or not all(c.isalnum() or c in "-_" for c in value):
        return "must be 1-24 letters, digits, '-' or '_' (Grafana uids are at most 40 characters)"
    return None


def _relative_time(value: Any) -> str | None:
    return None if value.startswith("now") else "must be a Grafana relative time such as now-1h"


def _tags(value: Any) -> str | None:
    return None if all(isinstance(t, str) and t for t in value) else "must be a list of non-empty strings"


def _empty_or_http_url(value: Any) -> str | None:
    return None if value == "" else http_url(value)


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """Section ``[dashboards]``: Grafana boards and the provisioning files written with them."""

    uid_prefix: str = setting("inferwatch", "Prefix of every dashboard uid.", check=_uid_part)
    tags: list[str] = setting(["inferwatch", "llm-serving"], "Tags put on every dashboard.", check=_tags)
    folder: str = setting("inferwatch", "Grafana folder the provisioned dashboards land in.")
    refresh: str = setting("30s", "Auto-refresh interval of every dashboard.")
    time_from: str = setting("now-1h", "Start of the default time range.", check=_relative_time)
    datasource_name: str = setting("Prometheus", "Name of the provisioned Prometheus data source.")
    datasource_uid: str = setting(
        "inferwatch-prometheus", "Uid of the provisioned Prometheus data source.", check=_uid_part
    )
    prometheus_url: str = setting(
        "http://prometheus:9090", "URL Grafana reaches Prometheus at (the compose service by default).",
        check=http_url,
    )
    trace_backend: str = setting(
        "jaeger", "Trace backend the exemplar links open: jaeger or tempo.", check=one_of(*TRACE_BACKENDS)
    )
    trace_datasource_uid: str = setting(
        "inferwatch-traces", "Uid of the provisioned trace data source.", check=_uid_part
    )
    trace_url: str = setting(
        "http://jaeger:16686", "URL Grafana reaches the trace backend's query API at.", check=http_url
    )
    exemplar_label: str = setting(
        "trace_id", "Exemplar label that holds the trace id (the sidecar writes trace_id)."
    )
    explain_base_url: str = setting(
        "", "Base URL of the sidecar (or a proxy in front of its /admin) that the latency panels' exemplars also "
        "link to: 'Explain this request' opens BASE/admin/requests/TRACE_ID (inferwatch explain's JSON). Set, the "
        "SLO board also gets a 'Slowest requests' table that Grafana reads from BASE/admin/requests through the "
        "Infinity data source (provisioned with the boards; the plugin yesoreyeram-infinity-datasource must be "
        "installed), each trace id a link to its explanation. Empty: neither. The /admin access rule applies: "
        "loopback, or the bearer token (dashboards.explain_token_file for Grafana's requests; a proxy that adds it "
        "for the links a browser opens).",
        check=_empty_or_http_url,
    )
    explain_token_file: str = setting(
        "", "Path, inside Grafana, of a file holding the sidecar's admin bearer token (what serve.admin_token_file "
        "holds): the provisioned Infinity data source sends it to the explain base URL (read by Grafana at start, "
        "$__file{PATH}). Empty: no token (Grafana must then reach the sidecar on loopback).",
    )
    sidecar_job: str = setting("inferwatch", "Prometheus job name that scrapes the sidecar.")
    vllm_job: str = setting("vllm", "Prometheus job name that scrapes vLLM directly.")
    prometheus_job: str = setting("prometheus", "Prometheus job name of Prometheus scraping itself.")
    grafana_dashboards_path: str = setting(
        "/var/lib/grafana/dashboards/inferwatch",
        "Directory inside Grafana that the dashboard provider reads (where the compose file mounts them).",
    )
    panel_height: int = setting(8, "Height of a panel, in Grafana grid rows.", check=positive)


__all__ = ["TRACE_BACKENDS", "DashboardConfig"]
