"""House defaults for panels, and the small grafanalib subclasses for what grafanalib 0.7.1 lacks.

grafanalib emits Grafana's old dashboard model; four things it cannot say are added here:

* :class:`PromTarget`: a Prometheus query with ``exemplar`` (grafanalib #683), ``range``/``instant``
  and ``intervalFactor`` 1, without the legacy ``query``/``metric``/``target``/``step`` keys.
* :class:`ModernHeatmap`: the Grafana 9+ heatmap (``options.calculate: false`` over pre-bucketed
  ``le`` series, the unit on the y axis) instead of grafanalib's Angular-era heatmap.
* :class:`InfinityTable`: a table read from a JSON endpoint through the Infinity data source, one column a
  data link (the slowest requests, each opening its explanation).
* threshold steps as plain dicts with a JSON ``null`` base value (grafanalib writes the string
  ``"null"``).

Every panel but the request table reads from the templated datasource ``${datasource}``; every panel has a unit
and a description. A :class:`Grid` places panels left to right on Grafana's 24-column grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import attr
from grafanalib import core

from dashboards import explain
from dashboards.queries import Query
from exporters.catalog.engines import families_in, missing_note

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
COLUMNS = 24
REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@attr.s
class PromTarget(core.Target):
    """A Prometheus target with the fields Grafana 10+ reads (exemplar, range) and no legacy keys."""

    exemplar: bool = attr.ib(default=False, validator=attr.validators.instance_of(bool))

    def to_json_data(self) -> dict[str, Any]:
        """The target as Grafana's current Prometheus query model."""
        return {
            "datasource": self.datasource,
            "editorMode": "code",
            "exemplar": self.exemplar,
            "expr": self.expr,
            "format": self.format,
            "hide": self.hide,
            "instant": self.instant,
            "interval": self.interval,
            "intervalFactor": 1,
            "legendFormat": self.legendFormat,
            "range": not self.instant,
            "refId": self.refId,
        }


@attr.s
class ModernHeatmap(core.Panel):
    """The Grafana 9+ heatmap panel over ``le`` buckets that Prometheus already computed."""

    unit: str = attr.ib(default="short", validator=attr.validators.instance_of(str))

    def to_json_data(self) -> dict[str, Any]:
        """The panel in the current heatmap model."""
        data: dict[str, Any] = self.panel_json({
            "type": "heatmap",
            "fieldConfig": {"defaults": {"unit": self.unit, "custom": {"hideFrom": {
                "legend": False, "tooltip": False, "viz": False}}}, "overrides": []},
            "options": {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5, "fill": "dark-orange",
                          "reverse": False, "scale": "exponential"},
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
                "filterValues": {"le": 1e-9},
                "legend": {"show": True},
                "rowsFrame": {"layout": "auto"},
                "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
                "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
            },
        })
        return data


@attr.s
class InfinityTable(core.Panel):
    """A table of the rows a JSON endpoint answers, read through the Infinity data source (one GET, the backend
    parser), with one column a data link."""

    url: str = attr.ib(default="", validator=attr.validators.instance_of(str))
    root: str = attr.ib(default="", validator=attr.validators.instance_of(str))
    columns: tuple[explain.Column, ...] = attr.ib(default=())
    link_column: str = attr.ib(default="", validator=attr.validators.instance_of(str))
    link_url: str = attr.ib(default="", validator=attr.validators.instance_of(str))

    def to_json_data(self) -> dict[str, Any]:
        """The panel in the table model, its target in Infinity's query model."""
        target = {
            "datasource": self.dataSource, "refId": "A", "type": "json", "source": "url", "parser": "backend",
            "format": "table", "url": self.url, "url_options": {"method": "GET", "data": ""},
            "root_selector": self.root, "filters": [],
            "columns": [{"selector": c.selector, "text": c.title, "type": c.type} for c in self.columns],
        }
        link = {"title": "Explain this request", "url": self.link_url, "targetBlank": True}
        overrides = [_by_name(c.title, {"id": "unit", "value": c.unit}) for c in self.columns if c.unit]
        overrides.append(_by_name(self.link_column, {"id": "links", "value": [link]}))
        data: dict[str, Any] = self.panel_json({
            "type": "table", "targets": [target],
            "fieldConfig": {"defaults": {"unit": "none"}, "overrides": overrides},
            "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}},
        })
        return data


def _by_name(field_name: str, *properties: dict[str, Any]) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": field_name}, "properties": list(properties)}


def steps(*levels: tuple[str, float | None]) -> list[dict[str, Any]]:
    """Threshold steps: ``steps(("green", None), ("red", 0.9))``; the first value must be None (the base)."""
    if not levels or levels[0][1] is not None:
        raise ValueError("the first threshold step is the base and takes no value")
    return [{"color": color, "value": value} for color, value in levels]


def targets(queries: Sequence[Query]) -> list[PromTarget]:
    """grafanalib targets from queries, with refIds A, B, C..."""
    if len(queries) > len(REF_IDS):
        raise ValueError(f"a panel takes at most {len(REF_IDS)} queries")
    out = []
    for ref, q in zip(REF_IDS, queries, strict=False):
        fmt = "table" if q.table else "heatmap" if q.heatmap else "time_series"
        # the fields inherited from grafanalib's Target are invisible to mypy (grafanalib is untyped)
        out.append(PromTarget(expr=q.expr, legendFormat=q.legend, refId=ref,  # type: ignore[call-arg]
                              instant=q.instant, format=fmt, exemplar=q.exemplar, datasource=DATASOURCE))
    return out


def _as_list(queries: Query | Sequence[Query]) -> list[Query]:
    return [queries] if isinstance(queries, Query) else list(queries)


@dataclass(frozen=True, slots=True)
class Spec:
    """A panel before placement: its kind, text, queries and display options."""

    kind: str
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    width: int = 8
    thresholds: tuple[tuple[str, float | None], ...] = ()
    threshold_lines: bool = False
    min_value: int | None = None
    max_value: int | None = None
    stacked: bool = False


def timeseries(title: str, description: str, unit: str, queries: Query | Sequence[Query], *, width: int = 8,
               thresholds: Sequence[tuple[str, float | None]] = (), lines: bool = False,
               min_value: int | None = None, max_value: int | None = None, stacked: bool = False) -> Spec:
    """A time-series panel; ``lines`` draws the thresholds as dashed lines."""
    return Spec("timeseries", title, description, unit, tuple(_as_list(queries)), width, tuple(thresholds),
                lines, min_value, max_value, stacked)


def stat(title: str, description: str, unit: str, queries: Query | Sequence[Query], *, width: int = 4,
         thresholds: Sequence[tuple[str, float | None]] = ()) -> Spec:
    """A stat panel showing the last value."""
    return Spec("stat", title, description, unit, tuple(_as_list(queries)), width, tuple(thresholds))


def table(title: str, description: str, unit: str, queries: Query | Sequence[Query], *, width: int = 12) -> Spec:
    """A table of an instant query's label sets."""
    return Spec("table", title, description, unit, tuple(_as_list(queries)), width)


def heatmap(title: str, description: str, unit: str, query: Query, *, width: int = 12) -> Spec:
    """A heatmap of histogram buckets."""
    return Spec("heatmap", title, description, unit, (query,), width)


@dataclass(frozen=True, slots=True)
class Row:
    """A row header; the panels after it, up to the next row, belong to it."""

    title: str


@dataclass(frozen=True, slots=True)
class RequestTable:
    """The sidecar's slowest requests (``/admin/requests`` through the Infinity data source), each trace id a link
    to its explanation."""

    title: str
    description: str
    url: str
    link_url: str
    width: int = COLUMNS


def slowest_requests(title: str, description: str, url: str, link_url: str) -> RequestTable:
    """A full-width table of the slowest requests at ``url``, each trace id linking to ``link_url``."""
    return RequestTable(title, description, url, link_url)


Item = Spec | Row | RequestTable
"""What a board lists: panels, row headers and request tables."""


def described(spec: Spec) -> str:
    """The panel's description, and the engines on which it stays empty (exporters/catalog/engines.py): a panel
    is never silently empty."""
    note = missing_note(set().union(*(families_in(q.expr) for q in spec.queries)))
    return f"{spec.description} {note}" if note else spec.description


def _request_table(table: RequestTable, grid_pos: core.GridPos) -> core.Panel:
    # the fields inherited from grafanalib's Panel are invisible to mypy (grafanalib is untyped)
    return InfinityTable(  # type: ignore[call-arg]
        title=table.title, description=table.description, dataSource=explain.DATASOURCE, gridPos=grid_pos,
        editable=False, url=table.url, root="requests", columns=explain.COLUMNS,
        link_column=explain.LINK_COLUMN.title, link_url=table.link_url,
    )


def _panel(spec: Spec, grid_pos: core.GridPos) -> core.Panel:
    common: dict[str, Any] = {
        "title": spec.title, "description": described(spec), "dataSource": DATASOURCE,
        "targets": targets(spec.queries), "gridPos": grid_pos, "editable": False,
    }
    thresholds = steps(*spec.thresholds) if spec.thresholds else steps(("green", None))
    if spec.kind == "timeseries":
        return core.TimeSeries(
            **common, unit=spec.unit, thresholds=thresholds,
            thresholdsStyleMode="dashed" if spec.threshold_lines else "off",
            valueMin=spec.min_value, valueMax=spec.max_value, legendDisplayMode="table",
            legendPlacement="bottom", legendCalcs=["lastNotNull", "max"], tooltipMode="multi",
            stacking={"mode": "normal", "group": "A"} if spec.stacked else {"mode": "none"},
            fillOpacity=30 if spec.stacked else 0,
        )
    if spec.kind == "stat":
        return core.Stat(**common, format=spec.unit, reduceCalc="lastNotNull", thresholds=thresholds,
                         graphMode="none", colorMode="value", textMode="value_and_name")
    if spec.kind == "table":
        return core.Table(**common, unit=spec.unit, extraJson={"fieldConfig": {"defaults": {"unit": spec.unit}}})
    if spec.kind == "heatmap":
        return ModernHeatmap(**common, unit=spec.unit)
    raise ValueError(f"unknown panel kind {spec.kind!r}")


@dataclass
class Grid:
    """Places rows and panels left to right on Grafana's 24-column grid."""

    height: int = 8
    x: int = 0
    y: int = 0
    line_height: int = 0
    panels: list[core.Panel] = field(default_factory=list)

    def add(self, item: Item) -> None:
        """Place one row header or panel."""
        if isinstance(item, Row):
            self._newline()
            self.panels.append(core.RowPanel(title=item.title, gridPos=core.GridPos(h=1, w=COLUMNS, x=0, y=self.y)))
            self.y += 1
            return
        if item.width > COLUMNS:
            raise ValueError(f"panel {item.title!r} is wider than {COLUMNS} columns")
        if self.x + item.width > COLUMNS:
            self._newline()
        grid_pos = core.GridPos(h=self.height, w=item.width, x=self.x, y=self.y)
        self.panels.append(_panel(item, grid_pos) if isinstance(item, Spec) else _request_table(item, grid_pos))
        self.x += item.width
        self.line_height = self.height

    def _newline(self) -> None:
        self.y += self.line_height
        self.x = 0
        self.line_height = 0


def layout(items: Sequence[Item], height: int) -> list[core.Panel]:
    """grafanalib panels with grid positions, in order."""
    grid = Grid(height=height)
    for item in items:
        grid.add(item)
    return grid.panels


__all__ = [
    "DATASOURCE", "Grid", "InfinityTable", "Item", "ModernHeatmap", "PromTarget", "RequestTable", "Row", "Spec",
    "heatmap", "layout", "slowest_requests", "stat", "steps", "table", "targets", "timeseries",
]
