"""All rule groups from the config, checked, and rendered as Prometheus rule-file structures and YAML.

``rule_groups(rules_config, length_edges)`` is the interface the embedded evaluator consumes:
the same dict that is written to the rule files Prometheus loads.
"""

from __future__ import annotations

from typing import Any

import yaml

from alert_rules import cutover, intervene, slo, tenant_slo
from alert_rules.annotate import annotate
from alert_rules.config import RulesConfig
from alert_rules.promql import UnsupportedExpression, check_supported
from alert_rules.spec import AlertRule, RuleGroup
from exporters.errors import ConfigError
from exporters.records import DEFAULT_LENGTH_EDGES


def build_groups(config: RulesConfig, length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> tuple[RuleGroup, ...]:
    """Every rule group, annotated, with unique alert names and every expression in the evaluator's subset.

    Raises:
        ConfigError: the config names an unknown alert, or produces an expression the embedded
            evaluator cannot run (the message names the group, the rule and the construct).
    """
    groups = annotate(config, (*slo.rule_groups(config), *intervene.rule_groups(config, tuple(length_edges)),
                               *cutover.rule_groups(config), *tenant_slo.rule_groups(config)))
    names = [a.name for g in groups for a in g.alerts()]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"alert names must be unique; duplicated: {', '.join(duplicates)}")
    unknown = sorted(set(config.severity_overrides) - set(names))
    if unknown:
        raise ConfigError(
            "rules.severity_overrides", f"names no alert ({unknown[0]!r}); alerts are {', '.join(names)}"
        )
    for group in groups:
        for rule in group.rules:
            try:
                check_supported(rule.expr)
            except UnsupportedExpression as err:
                named = f"alert {rule.name!r}" if isinstance(rule, AlertRule) else f"record {rule.record!r}"
                raise ConfigError("rules", f"group {group.name!r}, {named}: {err}") from err
    return groups


def alerts(config: RulesConfig, length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> tuple[AlertRule, ...]:
    """Every alert rule, in file order."""
    return tuple(a for g in build_groups(config, length_edges) for a in g.alerts())


def rule_groups(config: Any, length_edges: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Every group as one Prometheus rule-file structure: ``{"groups": [...]}``.

    ``config`` is a RulesConfig with ``length_edges``, or duck-typed settings with ``.rules`` and
    ``.serve.length_bucket_edges`` (serving.config.Settings); nothing here imports serving.
    """
    if hasattr(config, "rules"):
        if length_edges is None:
            length_edges = tuple(config.serve.length_bucket_edges)
        config = config.rules
    edges = DEFAULT_LENGTH_EDGES if length_edges is None else tuple(length_edges)
    return {"groups": [g.to_dict() for g in build_groups(config, edges)]}


def rule_files(config: RulesConfig, length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> dict[str, dict[str, Any]]:
    """Rule-file name (without ``.yml``) -> its structure, one file per area (``slo``, ``intervene``)."""
    files: dict[str, dict[str, Any]] = {}
    for group in build_groups(config, length_edges):
        files.setdefault(group.file, {"groups": []})["groups"].append(group.to_dict())
    return files


class _Dumper(yaml.SafeDumper):
    """Block style, literal blocks for multi-line strings, keys in insertion order, no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        """Write repeated values out in full: generated files are read by people."""
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(data: Any) -> str:
    """Deterministic YAML: the same input always gives the same bytes."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000,
                     allow_unicode=True)


__all__ = ["alerts", "build_groups", "rule_files", "rule_groups", "to_yaml"]
