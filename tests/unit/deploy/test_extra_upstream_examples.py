"""The commented scrape jobs for the sidecar's extra upstreams (``/metrics/upstream?name=NAME``) in the shipped
Prometheus configs: once uncommented, they are what they say (promtool checks the compose one in
tests/integration/test_extra_upstream_scrape_config.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from serving.extra_upstreams import EXTRA_METRICS_PATH
from tests.unit.deploy.kubernetes_schemas import schema_errors

REPO = Path(__file__).resolve().parents[3]
COMPOSE_PROMETHEUS = REPO / "dashboards" / "compose" / "prometheus.yml"
POD_MONITOR = REPO / "deploy" / "kubernetes" / "podmonitor.yaml"
_EXAMPLE_LINE = re.compile(r"^(\s*)#(?=-|  )")
"""A commented line of YAML (``#-`` or ``#`` and two spaces); prose comments have one space and a word."""


def uncommented(text: str) -> str:
    """``text`` with its commented YAML lines taken back in (the ``#`` removed, the indentation kept)."""
    return "\n".join(_EXAMPLE_LINE.sub(r"\1", line) for line in text.splitlines()) + "\n"


def _relabelled_name(relabels: list[dict[str, Any]], source: str, target: str) -> bool:
    return any(r.get(source) == ["__param_name"] and r.get(target) == "upstream_name" for r in relabels)


def test_the_compose_example_sends_each_name_to_the_sidecar_and_labels_it() -> None:
    """The compose job scrapes /metrics/upstream on the sidecar, one target per name as ``name``, and labels the
    series upstream_name from ``__param_name`` and an instance of their own (the rules aggregate the engine series
    by model_name and instance); commented out, the shipped config has no such job."""
    jobs = {job["job_name"]: job for job in yaml.safe_load(uncommented(COMPOSE_PROMETHEUS.read_text()))
            ["scrape_configs"]}
    shipped = {job["job_name"] for job in yaml.safe_load(COMPOSE_PROMETHEUS.read_text())["scrape_configs"]}
    job = jobs["inferwatch-upstreams"]
    assert "inferwatch-upstreams" not in shipped
    assert job["metrics_path"] == EXTRA_METRICS_PATH
    assert job["static_configs"] == [{"targets": ["long", "canary", "shadow"]}]
    relabels = job["relabel_configs"]
    assert {"source_labels": ["__address__"], "target_label": "__param_name"} in relabels
    assert _relabelled_name(relabels, "source_labels", "target_label")
    assert {"target_label": "__address__", "replacement": "sidecar:9100"} in relabels
    assert {"source_labels": ["__param_name"], "target_label": "instance", "replacement": "sidecar:9100/$1"} in relabels


def test_the_pod_monitor_example_validates_and_labels_the_name() -> None:
    """The PodMonitor's commented endpoint, taken in, passes the prometheus-operator schema and scrapes
    /metrics/upstream with a ``name`` parameter relabelled to upstream_name."""
    monitor = yaml.safe_load(uncommented(POD_MONITOR.read_text()))
    assert schema_errors(monitor) == []
    shipped, example = monitor["spec"]["podMetricsEndpoints"]
    assert len(yaml.safe_load(POD_MONITOR.read_text())["spec"]["podMetricsEndpoints"]) == 1
    assert (example["path"], example["params"], example["port"]) == (EXTRA_METRICS_PATH, {"name": ["long"]},
                                                                     shipped["port"])
    assert _relabelled_name(example["relabelings"], "sourceLabels", "targetLabel")
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name", "__param_name"], "separator": "/",
            "targetLabel": "instance"} in example["relabelings"]
