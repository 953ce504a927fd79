"""Where the boards open the sidecar's explanations (``inferwatch explain``): the URLs of ``/admin/requests``.

With ``dashboards.explain_base_url`` set, the latency panels' exemplars link to ``BASE/admin/requests/TRACE_ID``
(a destination of the Prometheus data source, :func:`dashboards.build.datasources`), and the SLO board has a
table of the slowest requests of its time range, read from ``BASE/admin/requests?slowest=N&from=${__from}``
through the Infinity data source (yesoreyeram-infinity-datasource, provisioned with the boards), each trace id a
link to its explanation. ``${__from}`` is Grafana's global start of the board's range in epoch milliseconds
(``$__range`` is interpolated for Prometheus and Loki queries only); the sidecar reads ``from`` as the start.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.config import DashboardConfig

INFINITY_TYPE = "yesoreyeram-infinity-datasource"
"""The Infinity data source plugin: JSON over HTTP as tables (Grafana's compose service installs it)."""
INFINITY_UID = "inferwatch-sidecar"
"""Uid of the provisioned Infinity data source the slowest-requests table reads from."""
DATASOURCE = {"type": INFINITY_TYPE, "uid": INFINITY_UID}
SLOWEST_ROWS = 20
"""Rows of the slowest-requests table."""
TRACE_VALUE = "${__value.raw}"
"""Grafana's data-link variable: the raw value of the cell (or exemplar label) clicked."""
BOARD_START = "${__from}"
"""Grafana's start of the board's time range, in epoch milliseconds."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the table: the field of a ``/admin/requests`` row it shows, its title, Infinity type, unit."""

    selector: str
    title: str
    type: str = "string"
    unit: str | None = None


COLUMNS = (
    Column("trace_id", "Trace id"),
    Column("start_unix", "Started", "timestamp_epoch_s"),
    Column("model", "Model"),
    Column("e2e_ms", "End to end", "number", "ms"),
    Column("ttft_ms", "First token", "number", "ms"),
    Column("outcome", "Outcome"),
    Column("cause", "Top cause"),
    Column("reason", "Why"),
)
"""The fields of exporters.explain's ``slowest_row`` the table shows, in order."""
LINK_COLUMN = COLUMNS[0]


def base_url(config: DashboardConfig) -> str:
    """The configured base URL without a trailing slash ('' when none is set)."""
    return config.explain_base_url.rstrip("/")


def request_url(config: DashboardConfig, trace_id: str = TRACE_VALUE) -> str:
    """The explanation of one request: ``BASE/admin/requests/TRACE_ID`` (the clicked value by default)."""
    return f"{base_url(config)}/admin/requests/{trace_id}"


def slowest_url(config: DashboardConfig, start: str = BOARD_START) -> str:
    """The slowest requests since ``start`` (epoch ms; the board's range start by default)."""
    return f"{base_url(config)}/admin/requests?slowest={SLOWEST_ROWS}&from={start}"


__all__ = [
    "BOARD_START", "COLUMNS", "DATASOURCE", "INFINITY_TYPE", "INFINITY_UID", "LINK_COLUMN", "SLOWEST_ROWS",
    "TRACE_VALUE", "Column", "base_url", "request_url", "slowest_url",
]
