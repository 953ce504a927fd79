"""No rule or dashboard query falls back to a constant: ``x or vector(0)`` draws a reassuring 0 where the
series is missing, even when nothing is scraped at all; a missing series must stay no data.

Every expression ``rules build`` writes (each ``--format``), every query ``dashboards build`` writes and
those shipped under deploy/kubernetes is parsed with promql-parser, so spacing, case, parentheses or a
``on()`` cannot hide a fallback. A fallback is the right side of an ``or`` that reads no series:
``vector(0)``, ``on() vector(1)``, ``sum(vector(0))``, ``vector(time() * 0)``. A guarded zero such as
``or 0 * count(inferwatch_upstream_scrape_up)`` reads a series, so it is only 0 where that series exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from dashboards.lint import TEMPLATE_FUNCTIONS, expand, walk
from serving.cli import main
from serving.commands.rules import FORMATS

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "deploy/kubernetes"


def constant_fallbacks(expr: str) -> list[str]:
    """The right sides of ``or`` in ``expr`` that read no series (Grafana variables expanded first)."""
    tree = promql_parser.parse(expand(expr))
    return [str(node.rhs) for node, _ in walk(tree)
            if isinstance(node, promql_parser.BinaryExpr) and str(node.op).lower() == "or"
            and not any(isinstance(n, promql_parser.VectorSelector) for n, _ in walk(node.rhs))]


def _rule_exprs(document: Any) -> Iterator[str]:
    """The ``expr`` of every rule in every rule group of a YAML document (a rule file or a PrometheusRule)."""
    if isinstance(document, dict):
        for group in document.get("groups") or ():
            for rule in group.get("rules") or ():
                yield rule["expr"]
        for value in document.values():
            yield from _rule_exprs(value)
    elif isinstance(document, list):
        for item in document:
            yield from _rule_exprs(item)


def _board_queries(node: Any) -> Iterator[str]:
    """Every panel target's ``expr`` in a dashboard, and the PromQL inside ``query_result(...)`` variables."""
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        query = node.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if isinstance(query, str) and (found := TEMPLATE_FUNCTIONS.match(query)) and found[1] == "query_result":
            yield found[2]
        for value in node.values():
            yield from _board_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _board_queries(item)


def _yaml_rule_exprs(root: Path) -> dict[str, str]:
    return {f"{path.relative_to(root)}: {expr}": expr for path in sorted(root.rglob("*.y*ml"))
            for document in yaml.safe_load_all(path.read_text()) for expr in _rule_exprs(document)}


def _json_board_queries(root: Path) -> dict[str, str]:
    return {f"{path.relative_to(root)}: {expr}": expr for path in sorted(root.rglob("*.json"))
            for expr in _board_queries(json.loads(path.read_text()))}


@pytest.fixture(name="expressions", scope="module")
def _expressions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Source -> (where: expression) of everything built and shipped."""
    out = tmp_path_factory.mktemp("built")
    found: dict[str, dict[str, str]] = {}
    for fmt in FORMATS:
        assert main(["rules", "build", "--format", fmt, "--out", str(out / fmt)]) == 0
        found[f"rules build --format {fmt}"] = _yaml_rule_exprs(out / fmt)
    assert main(["dashboards", "build", "--out", str(out / "boards")]) == 0
    found["dashboards build"] = _json_board_queries(out / "boards")
    found["deploy/kubernetes rules"] = _yaml_rule_exprs(SHIPPED)
    found["deploy/kubernetes dashboards"] = _json_board_queries(SHIPPED)
    return found


@pytest.mark.parametrize("expr", [
    "sum(x) or vector(0)",
    "sum(x)\n  OR\n  vector(0)",
    "sum(x) or on() vector(1)",
    "(sum(rate(x[$__rate_interval]))) or (vector(0))",
    "sum(x) or sum(vector(0))",
    "sum(x) or vector(time() * 0)",
    'sum by (a) (x) or label_replace(vector(0), "a", "none", "", "")',
    "(sum(x) or vector(0)) / sum(y)",
])
def test_a_constant_fallback_is_found(expr: str) -> None:
    """Each spelling of a constant fallback, nested or not, is reported."""
    assert constant_fallbacks(expr)


@pytest.mark.parametrize("expr", [
    "sum(x) or 0 * count(y)",
    "count by (alertstate) (ALERTS) or on() (0 * sum(prometheus_rule_group_rules))",
    "sum(x) or sum(y)",
    "sum(x) and on() vector(1)",
    "vector(0)",
])
def test_a_fallback_that_reads_a_series_is_not_reported(expr: str) -> None:
    """An ``or`` whose right side reads a series, and a constant outside an ``or``, are not fallbacks."""
    assert constant_fallbacks(expr) == []


def test_every_source_holds_expressions(expressions: dict[str, dict[str, str]]) -> None:
    """Each format of ``rules build``, ``dashboards build`` and the shipped manifests yield expressions to check."""
    assert set(expressions) == {*(f"rules build --format {fmt}" for fmt in FORMATS), "dashboards build",
                                "deploy/kubernetes rules", "deploy/kubernetes dashboards"}
    assert all(len(found) >= 10 for found in expressions.values()), {k: len(v) for k, v in expressions.items()}


def test_no_rule_or_dashboard_query_falls_back_to_a_constant(expressions: dict[str, dict[str, str]]) -> None:
    """No built or shipped rule expression or dashboard query has an ``or`` whose right side reads no series."""
    found = {f"{source} {where}": fallbacks for source, exprs in expressions.items()
             for where, expr in exprs.items() if (fallbacks := constant_fallbacks(expr))}
    assert found == {}
