"""Several replicas, each its own sidecar: the boards aggregate by model and break down by instance."""

from __future__ import annotations

from typing import Any

import promql_parser

from dashboards.lint import expand, walk

PER_INSTANCE_PANELS = ("Requests by instance", "Error ratio by instance", "TTFT p99 by instance",
                       "KV cache usage by instance")


def _panels(boards: dict[str, dict[str, Any]], board: str) -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in boards[board]["panels"] if p["type"] != "row"}


def _groupings(expr: str) -> list[set[str]]:
    tree = promql_parser.parse(expand(expr))
    return [set(n.modifier.labels) for n, _ in walk(tree)
            if isinstance(n, promql_parser.AggregateExpr) and n.modifier is not None]


def test_every_board_has_a_multi_value_instance_variable(boards: dict[str, dict[str, Any]]) -> None:
    """Each board offers Instance (All by default, multi-select) from a sidecar series, after Model."""
    for name, data in boards.items():
        variables = {t["name"]: t for t in data["templating"]["list"]}
        instance = variables["instance"]
        assert (instance["multi"], instance["includeAll"], instance["allValue"]) == (True, True, ".*"), name
        assert instance["query"].startswith("label_values(inferwatch_requests_total{"), name
        assert instance["query"].endswith(", instance)"), name
        names = list(variables)
        assert names.index("model_name") < names.index("instance"), name


def test_slo_board_breaks_down_by_instance(boards: dict[str, dict[str, Any]]) -> None:
    """The per-instance panels keep instance (and model) in every aggregation; the fleet ones drop it."""
    panels = _panels(boards, "inferwatch-slo.json")
    for title in PER_INSTANCE_PANELS:
        for target in panels[title]["targets"]:
            for grouping in _groupings(target["expr"]):
                assert {"instance", "model_name"} <= grouping, (title, target["expr"])
            assert "{{instance}}" in target["legendFormat"]
    for title in ("Requests by outcome", "Error ratio", "Time to first token", "Goodput"):
        for target in panels[title]["targets"]:
            assert all("instance" not in g for g in _groupings(target["expr"])), (title, target["expr"])


def test_fleet_error_ratio_is_a_ratio_of_sums(boards: dict[str, dict[str, Any]]) -> None:
    """The fleet error ratio sums rates by model over every instance, then divides (never avg of ratios)."""
    expr = _panels(boards, "inferwatch-slo.json")["Error ratio"]["targets"][0]["expr"]
    assert "avg" not in expr
    assert expr.count("sum by (model_name) (rate(inferwatch_requests_total{") == 3
    assert 'instance=~"$instance"' in expr


def test_fleet_quantiles_sum_buckets_by_le_and_model(boards: dict[str, dict[str, Any]]) -> None:
    """Latency percentiles come from buckets summed over instances by le and model."""
    for target in _panels(boards, "inferwatch-slo.json")["Time to first token"]["targets"]:
        assert target["expr"].startswith("histogram_quantile(")
        assert "sum by (le, model_name) (rate(inferwatch_time_to_first_token_seconds_bucket{" in target["expr"]
