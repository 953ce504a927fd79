"""deploy/kubernetes, read file by file (the kustomize rendering is tests/integration/test_kubernetes_manifests.py).

The hand-written manifests validate against the Kubernetes and prometheus-operator schemas
(kubernetes_schemas.py); the generated files are what the builders produce from
deploy/kubernetes/inferwatch.toml (rebuild them with ``make k8s-manifests``); and the pieces
agree with each other, with the sidecar's config, with the Dockerfile and with docker-compose.yml.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from alert_rules import prometheus_operator
from dashboards.build import files as dashboard_files
from serving.config import Settings, build_settings, read_toml
from tests.unit.deploy.kubernetes_schemas import schema_errors

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "kubernetes"
HAND_WRITTEN = ("deployment.yaml", "service.yaml", "persistentvolumeclaims.yaml", "podmonitor.yaml",
                "showback/cronjob.yaml")
REBUILD = "deploy/kubernetes is stale: run `make k8s-manifests`"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _one(kind: str) -> dict[str, Any]:
    (found,) = [d for name in HAND_WRITTEN for d in _docs(name) if d["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def settings() -> Settings:
    """The sidecar's settings from the ConfigMap's TOML."""
    return build_settings(read_toml(K8S / "inferwatch.toml"))


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    """The Deployment's pod spec."""
    spec: dict[str, Any] = _one("Deployment")["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def _arg(container: dict[str, Any], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "=")]
    return value


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_hand_written_manifests_validate(name: str) -> None:
    """Every object validates against its Kubernetes or CRD schema."""
    for obj in _docs(name):
        assert schema_errors(obj) == []


def test_kubernetes_schema_rejects_a_misspelled_field() -> None:
    """``readinesProbe`` for ``readinessProbe`` fails the strict Kubernetes schema."""
    deployment = copy.deepcopy(_one("Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][1]
    container["readinesProbe"] = container.pop("readinessProbe")
    assert any("readinesProbe" in e for e in schema_errors(deployment))


def test_generated_rule_objects_are_current(settings: Settings) -> None:
    """prometheus-operator/*.yaml and the AlertmanagerConfig are what ``rules build`` writes from inferwatch.toml."""
    expected = prometheus_operator.outputs(settings.rules, tuple(settings.serve.length_bucket_edges))
    found = {f"prometheus-operator/{p.name}": p.read_text() for p in (K8S / "prometheus-operator").glob("*.yaml")}
    component = K8S / "alertmanager-config/alertmanagerconfig.yaml"
    found["prometheus-operator/alertmanagerconfig.yaml"] = component.read_text()
    assert found == expected, REBUILD


def test_generated_dashboards_are_current(settings: Settings) -> None:
    """dashboards/*.json are, byte for byte, the boards ``dashboards build`` writes from inferwatch.toml."""
    built = {rel.removeprefix("dashboards/"): text for rel, text in
             dashboard_files(settings.dashboards, settings.rules, tuple(settings.serve.length_bucket_edges)).items()
             if rel.startswith("dashboards/")}
    found = {p.name: p.read_text() for p in (K8S / "dashboards").glob("*.json")}
    assert found == built, REBUILD


def test_kustomization_lists_every_generated_file() -> None:
    """Each rule object is a resource, each board has a labelled generator, the component has the AlertmanagerConfig."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    rule_files = {f"prometheus-operator/{p.name}" for p in (K8S / "prometheus-operator").glob("*.yaml")}
    assert rule_files <= set(kustomization["resources"])
    assert set(kustomization["resources"]) - rule_files == set(HAND_WRITTEN) - {"showback/cronjob.yaml"}  # a component
    boards = [g for g in kustomization["configMapGenerator"] if g["name"].startswith("inferwatch-dashboard-")]
    assert sorted(f for g in boards for f in g["files"]) == sorted(
        f"dashboards/{p.name}" for p in (K8S / "dashboards").glob("*.json"))
    for generator in boards:
        assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
        assert generator["options"]["disableNameSuffixHash"] is True
    component = yaml.safe_load((K8S / "alertmanager-config/kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert component["resources"] == ["alertmanagerconfig.yaml"]


def test_vllm_listens_on_loopback_behind_the_sidecar(pod: dict[str, Any], settings: Settings) -> None:
    """vLLM binds 127.0.0.1, no container port; the sidecar's upstream is that address, its listen port the pod's."""
    vllm, sidecar = _container(pod, "vllm"), _container(pod, "inferwatch")
    assert _arg(vllm, "--host") == "127.0.0.1"
    assert "ports" not in vllm
    assert settings.serve.upstream == f"http://127.0.0.1:{_arg(vllm, '--port')}"
    (port,) = sidecar["ports"]
    host, _, listen_port = settings.serve.listen.rpartition(":")
    assert (host, int(listen_port), port["name"]) == ("0.0.0.0", port["containerPort"], "http")


def test_service_and_pod_monitor_reach_the_sidecar_port(pod: dict[str, Any]) -> None:
    """The Service and the PodMonitor select the pod and use the sidecar's named port; the job is the boards'."""
    from dashboards.config import DashboardConfig

    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    service, monitor = _one("Service"), _one("PodMonitor")
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert {"targetLabel": "job", "replacement": DashboardConfig().sidecar_job, "action": "replace"} in endpoint[
        "relabelings"]


def test_sidecar_probes_use_healthz_and_readyz(pod: dict[str, Any]) -> None:
    """Liveness asks /healthz, readiness /readyz, both on the sidecar's port."""
    sidecar = _container(pod, "inferwatch")
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_pod_runs_as_the_dockerfiles_non_root_user(pod: dict[str, Any]) -> None:
    """runAsNonRoot with the Dockerfile's uid; no container may escalate or keep a capability."""
    uid = int(re.search(r"useradd [^&]*--uid (\d+)", (REPO / "Dockerfile").read_text()).group(1))
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == uid != 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "runAsUser" not in container["securityContext"], container["name"]


def test_every_container_requests_cpu_and_memory(pod: dict[str, Any]) -> None:
    """Each container requests CPU and memory and caps memory; vLLM gets a GPU."""
    for container in pod["containers"]:
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]
    assert _container(pod, "vllm")["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_request_logs_and_config_are_mounted_where_the_sidecar_reads_them(
    pod: dict[str, Any], settings: Settings
) -> None:
    """logs.dir is a PersistentVolumeClaim's mount; --config names the TOML inside the config map's mount."""
    sidecar = _container(pod, "inferwatch")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    claim = volumes[mounts[settings.logs.dir]]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for d in _docs("persistentvolumeclaims.yaml")}
    config_path = Path(sidecar["args"][sidecar["args"].index("--config") + 1])
    assert volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == "inferwatch-config"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (generator,) = [g for g in kustomization["configMapGenerator"] if g["name"] == "inferwatch-config"]
    assert generator["files"] == [config_path.name]


def test_images_are_those_of_docker_compose(pod: dict[str, Any]) -> None:
    """vLLM's image is the compose gpu profile's default, the sidecar's the compose sidecar image."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    vllm_default = re.fullmatch(r"\$\{VLLM_IMAGE:-(.+)\}", compose["services"]["vllm"]["image"]).group(1)
    assert _container(pod, "vllm")["image"] == vllm_default
    assert _container(pod, "inferwatch")["image"] == compose["services"]["sidecar"]["image"]


def test_process_pattern_finds_vllm_and_not_the_sidecar(pod: dict[str, Any], settings: Settings) -> None:
    """name_pattern matches vLLM's API server command lines, not the sidecar's; the pod shares its process namespace."""
    pattern = re.compile(settings.upstream_process.name_pattern)
    assert pod["shareProcessNamespace"] is True
    assert pattern.search("python3 -m vllm.entrypoints.openai.api_server --model=m --host=127.0.0.1")
    assert pattern.search("/usr/bin/python3 /usr/local/bin/vllm serve m --host=127.0.0.1")
    assert not pattern.search(" ".join(["inferwatch", *_container(pod, "inferwatch")["args"]]))


def test_the_showback_cronjob_reports_last_week_every_monday() -> None:
    """The showback component's CronJob runs `inferwatch showback` over 7 days at 09:00 UTC on Mondays, as the
    image's user, into its own volume."""
    component = yaml.safe_load((K8S / "showback/kustomization.yaml").read_text())
    assert (component["kind"], component["resources"]) == ("Component", ["cronjob.yaml"])
    (cronjob,) = [d for d in _docs("showback/cronjob.yaml") if d["kind"] == "CronJob"]
    assert (cronjob["spec"]["schedule"], cronjob["spec"]["timeZone"]) == ("0 9 * * 1", "Etc/UTC")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = " ".join(container["args"])
    assert command.startswith("exec inferwatch showback --prometheus")
    assert "--from 7d --to now" in command
    assert pod["securityContext"]["runAsUser"] == 10001
    assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v] == [
        "inferwatch-showback"]

