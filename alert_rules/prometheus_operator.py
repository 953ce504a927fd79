"""The rule files and the Alertmanager routing as prometheus-operator objects.

``inferwatch rules build --format prometheus-operator`` writes, besides the plain files, one
``PrometheusRule`` (monitoring.coreos.com/v1) per rule file whose ``spec`` is that file unchanged
(the same groups, in the same order), and the routing of ``alertmanager.yml`` as one
``AlertmanagerConfig`` (monitoring.coreos.com/v1alpha1): route tree, matchers, timings, the
inhibit rule and the webhook receivers map one to one. What does not map, or changes on the way:

- Scope: the operator adds ``namespace="<the AlertmanagerConfig's namespace>"`` to its route and
  to both sides of its inhibit rules, so only alerts with that ``namespace`` label are routed by
  it. Our rules aggregate the label away (``sum by (model_name)``): run Prometheus with
  ``enforcedNamespaceLabel: namespace`` (the operator then adds it to every rule of every
  PrometheusRule), or give the Alertmanager ``alertmanagerConfigMatcherStrategy: {type: None}``.
- Place: the route becomes a first-level route under the Alertmanager's own root route; the
  root's receiver, ``global`` settings and templates stay with the Alertmanager object, and the
  receivers are renamed ``<namespace>/<name>/<receiver>`` in the generated configuration.
- Anything else in ``alertmanager.yml`` (``global``, ``templates``, ``time_intervals``, other
  receiver kinds, matchers with escaped values): there is no mapping here, and
  :func:`alertmanager_config_object` raises ValueError instead of dropping it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from alert_rules.alertmanager import alertmanager_config
from alert_rules.config import RulesConfig
from alert_rules.render import rule_files, to_yaml
from exporters.files import write_atomic
from exporters.records import DEFAULT_LENGTH_EDGES

PROMETHEUS_RULE_API_VERSION = "monitoring.coreos.com/v1"
ALERTMANAGER_CONFIG_API_VERSION = "monitoring.coreos.com/v1alpha1"
NAME_PREFIX = "inferwatch"
LABELS = {"app.kubernetes.io/part-of": "inferwatch"}
OUT_DIR = "prometheus-operator"
"""Folder under ``rules build --out`` that the objects are written to."""

_ROUTE_KEYS = {
    "receiver": "receiver", "group_by": "groupBy", "group_wait": "groupWait",
    "group_interval": "groupInterval", "repeat_interval": "repeatInterval", "continue": "continue",
}
_RECEIVER_KEYS = {"name": "name", "webhook_configs": "webhookConfigs"}
_WEBHOOK_KEYS = {"url": "url", "send_resolved": "sendResolved"}
_INHIBIT_KEYS = {"source_matchers": "sourceMatch", "target_matchers": "targetMatch", "equal": "equal"}
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"\\]*)"\s*$')


def _object(api_version: str, kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": dict(LABELS)},
            "spec": spec}


def prometheus_rule_objects(files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rule-file name -> a PrometheusRule named ``inferwatch-<name>`` holding exactly that file's groups."""
    return {
        name: _object(PROMETHEUS_RULE_API_VERSION, "PrometheusRule", f"{NAME_PREFIX}-{name}",
                      {"groups": data["groups"]})
        for name, data in files.items()
    }


def _renamed(data: dict[str, Any], keys: dict[str, str], what: str) -> dict[str, Any]:
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise ValueError(f"{what} key {unknown[0]!r} does not map to an AlertmanagerConfig")
    return {keys[key]: value for key, value in data.items()}


def _matcher(text: str) -> dict[str, str]:
    """``name="value"`` (or ``!=``, ``=~``, ``!~``) as the CRD's ``{name, matchType, value}``."""
    match = _MATCHER.match(text)
    if match is None:
        raise ValueError(f"matcher {text!r} does not map to an AlertmanagerConfig matcher")
    name, match_type, value = match.groups()
    return {"name": name, "matchType": match_type, "value": value}


def _route(route: dict[str, Any]) -> dict[str, Any]:
    plain = {k: v for k, v in route.items() if k not in ("matchers", "routes")}
    out = _renamed(plain, _ROUTE_KEYS, "route")
    if "matchers" in route:
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    if "routes" in route:
        out["routes"] = [_route(child) for child in route["routes"]]
    return out


def _receiver(receiver: dict[str, Any]) -> dict[str, Any]:
    out = _renamed(receiver, _RECEIVER_KEYS, "receiver")
    if "webhookConfigs" in out:
        out["webhookConfigs"] = [_renamed(w, _WEBHOOK_KEYS, "webhook_configs") for w in out["webhookConfigs"]]
    return out


def _inhibit_rule(rule: dict[str, Any]) -> dict[str, Any]:
    out = _renamed(rule, _INHIBIT_KEYS, "inhibit_rules")
    for side in ("sourceMatch", "targetMatch"):
        if side in out:
            out[side] = [_matcher(m) for m in out[side]]
    return out


def alertmanager_config_object(config: dict[str, Any]) -> dict[str, Any]:
    """An ``alertmanager.yml`` structure as an AlertmanagerConfig named ``inferwatch``.

    Raises:
        ValueError: ``config`` holds something without a counterpart in the CRD (module docstring).
    """
    spec = _renamed(config, {"route": "route", "inhibit_rules": "inhibitRules", "receivers": "receivers"},
                    "alertmanager.yml")
    if "route" in spec:
        spec["route"] = _route(spec["route"])
    if "inhibitRules" in spec:
        spec["inhibitRules"] = [_inhibit_rule(r) for r in spec["inhibitRules"]]
    if "receivers" in spec:
        spec["receivers"] = [_receiver(r) for r in spec["receivers"]]
    return _object(ALERTMANAGER_CONFIG_API_VERSION, "AlertmanagerConfig", NAME_PREFIX, spec)


def outputs(rules: RulesConfig, length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> dict[str, str]:
    """Relative path -> YAML of every object: ``prometheus-operator/prometheusrule-<file>.yaml`` and
    ``prometheus-operator/alertmanagerconfig.yaml``."""
    out = {
        f"{OUT_DIR}/prometheusrule-{name}.yaml": to_yaml(obj)
        for name, obj in prometheus_rule_objects(rule_files(rules, length_edges)).items()
    }
    out[f"{OUT_DIR}/alertmanagerconfig.yaml"] = to_yaml(alertmanager_config_object(alertmanager_config(rules)))
    return out


def write_all(settings: Any, out_dir: Path) -> list[Path]:
    """Write every object under ``out_dir`` and return the paths written.

    ``settings`` is duck-typed like :func:`alert_rules.build.write_all`'s.
    """
    edges = tuple(settings.serve.length_bucket_edges)
    written = []
    for rel, text in outputs(settings.rules, edges).items():
        path = Path(out_dir) / rel
        write_atomic(path, text)
        written.append(path)
    return written


__all__ = [
    "ALERTMANAGER_CONFIG_API_VERSION", "LABELS", "NAME_PREFIX", "OUT_DIR", "PROMETHEUS_RULE_API_VERSION",
    "alertmanager_config_object", "outputs", "prometheus_rule_objects", "write_all",
]
