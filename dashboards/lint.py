"""A lint of rendered dashboards: grafana/dashboard-linter's rules, re-implemented, plus structure checks.

Rules (names as in dashboard-linter where one exists; shared/reference/dashboards.md §2.3):

* ``template-datasource-rule``: a ``datasource`` variable of type datasource, labelled "Data source".
* ``template-label-promql-rule``: query variables are ``label_values``/``label_names``/``metrics``/
  ``query_result`` around valid PromQL.
* ``template-on-time-change-reload-rule``: query variables refresh on time-range change (2).
* ``template-selector-rule`` (the linter's job/instance rule, for our keys model_name, instance, engine,
  gpu): the variable uses ``$datasource``, is a multi-select query with "All" and an ``allValue``.
* ``template-variable-defined-rule``: every ``$variable`` a target or a variable query uses is defined on
  the board (or is one of Grafana's globals).
* ``panel-datasource-rule``: panels and targets read ``$datasource``/``${datasource}``, or all read the
  provisioned Infinity data source (the slowest-requests table).
* ``infinity-target-rule``: an Infinity target GETs a JSON URL as a table with named columns, and one column of
  its panel is a data link (dashboards/explain.py).
* ``panel-title-description-rule``, ``panel-units-rule``, ``panel-no-targets-rule``.
* ``target-promql-rule``: every expression parses after Grafana variables are expanded.
* ``target-rate-interval-rule``: a range directly inside ``rate``/``irate`` is ``$__rate_interval``.
* ``target-selector-rule`` (the linter's target job/instance rule): a selector of a family that has a
  ``model_name`` (``engine``, ``gpu``) label filters on ``$model_name`` (``$engine``, ``$gpu``), and a
  selector of a family Prometheus scrapes from a replica (sidecar, vLLM) filters ``instance`` on
  ``$instance``; the labels come from :func:`dashboards.queries.filter_labels`, as the queries' own.
* ``target-instance-grouping-rule``: an aggregation that keeps ``engine`` or ``gpu`` (numbered per
  replica: engine 0 and GPU 0 exist on every pod) keeps ``instance`` too, so replicas are not added up.
* ``target-counter-agg-rule``: a counter is only read through ``rate``/``irate``/``increase``/``resets``
  over a range; counter-ness comes from the catalog's types, not from a ``_total`` suffix.
* ``uneditable-dashboard``: provisioned boards are ``editable: false``.
* ``structure-rule``: uid present and at most 40 characters; unique panel ids; unique refIds per
  panel; panels inside the 24 columns and not overlapping.

Panel rules apply to every panel type except rows (the linter skips heatmaps; we do not).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import promql_parser

from dashboards import explain
from dashboards.queries import VARIABLE_LABELS, filter_labels
from exporters.catalog import ALL_SPECS, MetricSpec, MetricType

MAGIC = {"$__rate_interval": "7777s", "${__rate_interval}": "7777s", "$__interval": "7778s",
         "${__interval}": "7778s", "$__range": "7779s", "${__range}": "7779s"}
"""Grafana's global interval variables -> unique durations, so the rate-interval rule can find them."""
RATE_INTERVAL_SECONDS = 7777
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?")
SELECTOR_VARIABLES = VARIABLE_LABELS
GLOBALS = frozenset({"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms",
                     "__from", "__to", "__dashboard", "__name", "__org", "__user", "__timeFilter"})
"""Grafana's built-in variables: never defined on a board."""
PER_REPLICA_LABELS = frozenset({"engine", "gpu"})
"""Labels numbered within one replica: grouping by them without ``instance`` adds replicas together."""
COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase", "resets"})
TEMPLATE_FUNCTIONS = re.compile(r"^\s*(label_values|label_names|metrics|query_result)\((.*)\)\s*$", re.S)

UNITS = frozenset({
    # misc
    "none", "short", "string", "percent", "percentunit", "humidity", "dB", "hex0x", "hex", "sci", "locale",
    "pixel",
    # time
    "hertz", "ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms", "dtdhms", "timeticks",
    "clockms", "clocks",
    # date
    "dateTimeAsIso", "dateTimeAsIsoNoDateIfToday", "dateTimeAsUS", "dateTimeAsUSNoDateIfToday",
    "dateTimeAsLocal", "dateTimeAsLocalNoDateIfToday", "dateTimeAsSystem", "dateTimeFromNow",
    # data
    "bits", "bytes", "kbytes", "mbytes", "gbytes", "tbytes", "pbytes", "decbits", "decbytes", "deckbytes",
    "decmbytes", "decgbytes", "dectbytes", "decpbytes",
    # data rate
    "pps", "binbps", "Bps", "KiBs", "Kibits", "MiBs", "Mibits", "GiBs", "Gibits", "TiBs", "Tibits", "PiBs",
    "Pibits", "bps", "Kbits", "Mbits", "Gbits", "Tbits", "Pbits", "KBs", "MBs", "GBs", "TBs", "PBs",
    # throughput
    "cps", "ops", "reqps", "rps", "wps", "iops", "eps", "mps", "recps", "rowsps", "cpm", "opm", "reqpm", "rpm",
    "wpm", "epm", "mpm", "recpm", "rowspm",
    # energy
    "watt", "kwatt", "megwatt", "gwatt", "mwatt", "Wm2", "voltamp", "kvoltamp", "voltampreact", "kvoltampreact",
    "watth", "watthperkg", "kwatth", "kwattm", "mwatth", "amph", "kamph", "mamph", "joule", "ev", "amp", "kamp",
    "mamp", "volt", "kvolt", "mvolt", "dBm", "mohm", "ohm", "kohm", "Mohm", "farad", "µfarad", "nfarad",
    "pfarad", "ffarad", "henry", "mhenry", "µhenry", "lumens",
    # temperature
    "celsius", "fahrenheit", "kelvin",
    # frequency
    "rothz", "rotrpm", "rotrads", "rotdegs",
})
"""Grafana unit ids (the standard categories used by operations dashboards)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One lint finding."""

    rule: str
    dashboard: str
    panel: str
    message: str

    def __str__(self) -> str:
        where = f"{self.dashboard}/{self.panel}" if self.panel else self.dashboard
        return f"[{self.rule}] {where}: {self.message}"


def expand(expr: str) -> str:
    """Replace Grafana variables: interval globals by magic durations, the rest by a literal value."""
    for var, value in MAGIC.items():
        expr = expr.replace(var, value)
    return _VARIABLE.sub("value", expr)


def _types() -> dict[str, MetricType]:
    types: dict[str, MetricType] = {}
    for spec in ALL_SPECS:
        for name in spec.sample_names():
            types[name] = MetricType.COUNTER if spec.type is MetricType.HISTOGRAM else spec.type
        for alias in spec.aliases.values():
            types[alias] = spec.type
    return types


def _labels() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for spec in ALL_SPECS:
        for name in spec.sample_names():
            out[name] = filter_labels(spec)
    return out


SAMPLE_TYPES = _types()
SAMPLE_LABELS = _labels()


def _children(node: Any) -> list[Any]:
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.AggregateExpr):
        return [c for c in (node.param, node.expr) if c is not None]
    if isinstance(node, promql_parser.Call):
        return list(node.args)
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        return [node.expr]
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    return []


def walk(node: Any, parent: Any = None) -> Iterator[tuple[Any, Any]]:
    """Every node of a parsed expression with its parent."""
    yield node, parent
    for child in _children(node):
        yield from walk(child, node)


def selectors(expr: str) -> list[Any]:
    """Every vector selector of an expression (Grafana variables expanded first)."""
    return [n for n, _ in walk(promql_parser.parse(expand(expr))) if isinstance(n, promql_parser.VectorSelector)]


def metric_names(expr: str) -> set[str]:
    """Every metric name an expression reads."""
    return {s.name for s in selectors(expr) if s.name}


def _check_expr(expr: str, finding: Any) -> None:
    try:
        tree = promql_parser.parse(expand(expr))
    except (ValueError, RuntimeError) as err:
        finding("target-promql-rule", f"does not parse: {err}: {expr}")
        return
    for node, parent in walk(tree):
        if (isinstance(node, promql_parser.MatrixSelector) and isinstance(parent, promql_parser.Call)
                and parent.func.name in ("rate", "irate") and node.range.total_seconds() != RATE_INTERVAL_SECONDS):
            finding("target-rate-interval-rule", f"{parent.func.name}() range must be $__rate_interval: {expr}")
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            kept = set(node.modifier.labels)
            if str(node.modifier.type).endswith("By") and kept & PER_REPLICA_LABELS and "instance" not in kept:
                finding("target-instance-grouping-rule",
                        f"grouping by {', '.join(sorted(kept & PER_REPLICA_LABELS))} must keep instance: {expr}")
        if not isinstance(node, promql_parser.VectorSelector) or not node.name:
            continue
        labels = SAMPLE_LABELS.get(node.name, ())
        present = {m.name: m.value for m in node.matchers.matchers}
        for label, var in SELECTOR_VARIABLES.items():
            if label in labels and present.get(label) != "value":
                finding("target-selector-rule", f"{node.name} must filter {label}=~\"{var}\": {expr}")
        if SAMPLE_TYPES.get(node.name) is MetricType.COUNTER:
            _check_counter(tree, node, expr, finding)


def _check_counter(tree: Any, selector: Any, expr: str, finding: Any) -> None:
    for node, parent in walk(tree):
        if node is not selector:
            continue
        ok = (isinstance(parent, promql_parser.MatrixSelector) and any(
            isinstance(call, promql_parser.Call) and call.func.name in COUNTER_FUNCTIONS and inner is parent
            for inner, call in walk(tree)
        ))
        if not ok:
            finding("target-counter-agg-rule", f"counter {selector.name} must be read through rate(), irate(), "
                    f"increase() or resets(): {expr}")
        return


def _panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in data.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _datasource_ok(ds: Any) -> bool:
    uid = ds.get("uid") if isinstance(ds, dict) else ds
    return uid in ("$datasource", "${datasource}")


def _is_infinity(panel: dict[str, Any]) -> bool:
    return panel.get("datasource") == explain.DATASOURCE


def _lint_infinity(panel: dict[str, Any], finding: Any) -> None:
    for target in panel.get("targets") or []:
        if target.get("datasource") != explain.DATASOURCE:
            finding("panel-datasource-rule", f"target datasource must be {explain.DATASOURCE}")
        shape = (target.get("type"), target.get("source"), target.get("format"),
                 (target.get("url_options") or {}).get("method"))
        if shape != ("json", "url", "table", "GET") or not target.get("url"):
            finding("infinity-target-rule", f"target must GET a JSON url as a table, not {shape}")
        if not target.get("columns") or not all(c.get("selector") and c.get("text") for c in target["columns"]):
            finding("infinity-target-rule", "target must name its columns (selector and text)")
    overrides = panel.get("fieldConfig", {}).get("overrides", [])
    if not any(prop.get("id") == "links" and prop.get("value") for o in overrides for prop in o.get("properties", [])):
        finding("infinity-target-rule", "one column must be a data link")


def _lint_templates(data: dict[str, Any], finding: Any) -> None:
    templates = data.get("templating", {}).get("list", [])
    sources = [t for t in templates if t.get("type") == "datasource"]
    if not any(t.get("name") == "datasource" for t in sources):
        finding("template-datasource-rule", "needs a datasource variable named 'datasource'")
    for t in sources:
        if t.get("label") not in ("Data source", "Prometheus data source"):
            finding("template-datasource-rule",
                    f"datasource variable label must be 'Data source', not {t.get('label')!r}")
        if t.get("query") != "prometheus":
            finding("template-datasource-rule", "datasource variable must select prometheus data sources")
    for t in templates:
        if t.get("type") != "query":
            continue
        name = t.get("name")
        if t.get("refresh") != 2:
            finding("template-on-time-change-reload-rule", f"variable {name} must refresh on time-range change (2)")
        query = t.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        match = TEMPLATE_FUNCTIONS.match(query)
        if not match:
            finding("template-label-promql-rule", f"variable {name} query must be label_values(...) or similar")
        else:
            inner = match.group(2)
            if match.group(1) == "label_values" and "," in inner:
                inner = inner.rsplit(",", 1)[0]
            try:
                if inner.strip():
                    promql_parser.parse(expand(inner))
            except (ValueError, RuntimeError) as err:
                finding("template-label-promql-rule", f"variable {name} has invalid PromQL: {err}")
        if name in SELECTOR_VARIABLES:
            if not _datasource_ok(t.get("datasource")):
                finding("template-selector-rule", f"variable {name} must use $datasource")
            if not t.get("multi") or not t.get("includeAll") or not t.get("allValue"):
                finding("template-selector-rule", f"variable {name} must be multi-select with All and an allValue")


def _variables_used(text: str) -> set[str]:
    return {m.group(1) for m in _VARIABLE.finditer(text)} - GLOBALS


def _lint_variables_defined(data: dict[str, Any], finding: Any) -> None:
    templates = data.get("templating", {}).get("list", [])
    defined = {t.get("name") for t in templates}
    for t in templates:
        query = t.get("query")
        query = query.get("query", "") if isinstance(query, dict) else str(query or "")
        for name in sorted(_variables_used(query) - defined):
            finding("template-variable-defined-rule", f"variable {t.get('name')} uses ${name}, not defined")
    for panel in _panels(data):
        for target in panel.get("targets") or []:
            for name in sorted(_variables_used(str(target.get("expr", ""))) - defined):
                finding("template-variable-defined-rule",
                        f"panel {panel.get('title')!r} uses ${name}, not defined on the board")


def _lint_structure(data: dict[str, Any], finding: Any) -> None:
    uid = data.get("uid") or ""
    if not uid or len(uid) > 40:
        finding("structure-rule", f"uid must be 1-40 characters, not {uid!r}")
    ids = [p.get("id") for p in _panels(data)]
    if None in ids or len(ids) != len(set(ids)):
        finding("structure-rule", "panel ids must be present and unique")
    cells: dict[tuple[int, int], str] = {}
    for panel in data.get("panels", []):
        pos = panel.get("gridPos") or {}
        x, y, w, h = (pos.get(k, -1) for k in ("x", "y", "w", "h"))
        if x < 0 or y < 0 or w <= 0 or h <= 0 or x + w > 24:
            finding("structure-rule", f"panel {panel.get('title')!r} is outside the 24-column grid: {pos}")
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    finding("structure-rule", f"panel {panel.get('title')!r} overlaps {cells[cx, cy]!r}")
                    break
                cells[cx, cy] = panel.get("title", "")
            else:
                continue
            break


def _unit(panel: dict[str, Any]) -> str | None:
    field_config = panel.get("fieldConfig", {})
    for override in field_config.get("overrides", []):
        for prop in override.get("properties", []):
            if prop.get("id") == "unit":
                return str(prop.get("value"))
    unit = field_config.get("defaults", {}).get("unit")
    return None if unit is None else str(unit)


def lint(data: dict[str, Any]) -> list[Finding]:
    """Every finding for one rendered dashboard (the dict written to disk)."""
    findings: list[Finding] = []
    title = str(data.get("title", "?"))
    panel_title = ""

    def finding(rule: str, message: str) -> None:
        findings.append(Finding(rule, title, panel_title, message))

    if data.get("editable") is not False:
        finding("uneditable-dashboard", "provisioned dashboards must be editable: false")
    _lint_templates(data, finding)
    _lint_variables_defined(data, finding)
    _lint_structure(data, finding)
    for panel in _panels(data):
        if panel.get("type") == "row":
            continue
        panel_title = str(panel.get("title", ""))
        if not panel_title.strip() or not str(panel.get("description", "")).strip():
            finding("panel-title-description-rule", "needs a title and a description")
        if _is_infinity(panel):
            _lint_infinity(panel, finding)
        elif not _datasource_ok(panel.get("datasource")):
            finding("panel-datasource-rule", "panel datasource must be $datasource")
        unit = _unit(panel)
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("mappings") and unit not in UNITS:
            finding("panel-units-rule", f"unit {unit!r} is not a Grafana unit")
        targets = panel.get("targets") or []
        if not targets:
            finding("panel-no-targets-rule", "needs at least one target")
        refs = [t.get("refId") for t in targets]
        if len(refs) != len(set(refs)) or None in refs:
            finding("structure-rule", "target refIds must be present and unique")
        for target in [] if _is_infinity(panel) else targets:
            if target.get("datasource") is not None and not _datasource_ok(target["datasource"]):
                finding("panel-datasource-rule", "target datasource must be $datasource")
            _check_expr(str(target.get("expr", "")), finding)
        panel_title = ""
    return findings


def spec_of(name: str) -> MetricSpec | None:
    """The catalog spec that exposes a sample name, if any."""
    for spec in ALL_SPECS:
        if name in spec.sample_names() or name in spec.aliases.values():
            return spec
    return None


__all__ = ["UNITS", "Finding", "expand", "lint", "metric_names", "selectors", "spec_of", "walk"]
