"""Validate Kubernetes objects against schemas that are not ours.

- Built-in kinds (Deployment, Service, ConfigMap, PersistentVolumeClaim): the Kubernetes
  OpenAPI-derived JSON schemas shipped in the ``kubernetes-validate`` wheel, strict (an unknown
  field is an error, as ``kubectl apply``'s default strict field validation makes it), for
  Kubernetes :data:`KUBERNETES_VERSION`.
- The prometheus-operator kinds (PrometheusRule, PodMonitor, AlertmanagerConfig): the CRD
  schemas are not downloadable here, so the pydantic models of ``cloudcoil.models.prometheus_operator``
  0.80.1.0 (PyPI), generated from prometheus-operator v0.80.1's CRD OpenAPI schemas (field names,
  types, required fields, enums and patterns such as the duration regex), stand in for them. The
  models ignore unknown fields, so an object must also come back unchanged from
  ``model_dump(by_alias=True, exclude_unset=True)``: a field the CRD does not have is dropped
  and shows up as a difference. An AlertmanagerConfig's child routes are free-form in the CRD
  (``x-kubernetes-preserve-unknown-fields``); the operator parses them as routes, and so do we.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from cloudcoil.models.prometheus_operator import v1, v1alpha1
from pydantic import BaseModel, ValidationError

KUBERNETES_VERSION = "1.32"
OPERATOR_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): v1.PrometheusRule,
    ("monitoring.coreos.com/v1", "PodMonitor"): v1.PodMonitor,
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): v1alpha1.AlertmanagerConfig,
}


def _differences(given: Any, back: Any, path: str) -> list[str]:
    if isinstance(given, dict) and isinstance(back, dict):
        out = [f"{path}.{key}: not a field of the CRD" for key in given if key not in back]
        for key in given.keys() & back.keys():
            out.extend(_differences(given[key], back[key], f"{path}.{key}"))
        return out
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        return [d for i, (g, b) in enumerate(zip(given, back, strict=True)) for d in _differences(g, b, f"{path}[{i}]")]
    return [] if given == back else [f"{path}: {given!r} came back as {back!r}"]


def _model_errors(model: type[BaseModel], data: Any, path: str) -> list[str]:
    try:
        parsed = model.model_validate(data)
    except ValidationError as err:
        return [f"{path}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
    return _differences(data, parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"), path)


def _child_route_errors(route: dict[str, Any], path: str) -> list[str]:
    errors = []
    for i, child in enumerate(route.get("routes") or []):
        errors.extend(_model_errors(v1alpha1.Route, child, f"{path}.routes[{i}]"))
        if isinstance(child, dict):
            errors.extend(_child_route_errors(child, f"{path}.routes[{i}]"))
    return errors


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every way ``obj`` fails its kind's schema; a kind with no schema here is an error too."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    name = f"{key[1]}/{obj.get('metadata', {}).get('name', '?')}"
    model = OPERATOR_MODELS.get(key)
    if model is not None:
        errors = _model_errors(model, obj, name)
        if key[1] == "AlertmanagerConfig":
            errors.extend(_child_route_errors(obj.get("spec", {}).get("route") or {}, f"{name}.spec.route"))
        return errors
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{name}: no schema for {key[0]} {key[1]}"]
    except kubernetes_validate.ValidationError as err:
        return [f"{name}.{'.'.join(str(p) for p in err.path)}: {err.message}"]
    return []


__all__ = ["KUBERNETES_VERSION", "OPERATOR_MODELS", "schema_errors"]
