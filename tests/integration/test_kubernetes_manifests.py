"""deploy/kubernetes as ``kubectl kustomize`` renders it, checked with kubectl, promtool and the schemas.

kubectl is the one on PATH: it needs kustomize v5 (kubectl 1.27 or newer; checked with kubectl
1.32.4 and kustomize v5.5.0, which this machine image ships; Debian's ``kubernetes-client`` is 1.20,
too old for ``labels``, components and generator options). Under ``CI=true`` a missing kubectl or
promtool fails the run. Every rendered object validates against the Kubernetes 1.32 schemas or the
prometheus-operator CRD models (tests/unit/deploy/kubernetes_schemas.py); the PrometheusRules hold
the very groups of the plain rule files and pass ``promtool check rules`` and the generated
``promtool test rules`` files; the dashboard ConfigMaps hold exactly what ``inferwatch dashboards
build`` writes. The rendering (base plus the alertmanager-config component) is compared with
``tests/data/kubernetes/kustomize-rendered.yaml``, each board's JSON there replaced by its SHA-256
(the boards' text is checked against the builder instead). Regenerate the golden with
``INFERWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/integration/test_kubernetes_manifests.py``.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.harness import servers
from tests.unit.deploy.golden import assert_golden
from tests.unit.deploy.kubernetes_schemas import schema_errors

pytestmark = pytest.mark.real_server

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
CONFIG = K8S / "inferwatch.toml"
DASHBOARD_LABEL = ("grafana_dashboard", "1")
WITH_COMPONENT = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../kubernetes]
components: [../kubernetes/alertmanager-config]
"""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (kustomize writes ``matchType: =``) as the ``value`` tag: read a string."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _kubectl() -> Path:
    found = shutil.which("kubectl")
    if found is None:
        raise servers.ServerUnavailable("kubectl 1.27 or newer (kustomize v5) is missing from PATH")
    return Path(found)


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def _render(kubectl: Path, directory: Path) -> list[dict[str, Any]]:
    result = _run(kubectl, "kustomize", directory)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.load_all(result.stdout, Loader=_Loader) if d]


@pytest.fixture(scope="module")
def kubectl() -> Path:
    """kubectl, whose ``kustomize`` subcommand renders offline."""
    return require(_kubectl)


@pytest.fixture(scope="module")
def rendered(kubectl: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """``base``: deploy/kubernetes rendered; ``full``: the base with the alertmanager-config component."""
    root = tmp_path_factory.mktemp("kustomize")
    shutil.copytree(K8S, root / "kubernetes")
    (root / "full").mkdir()
    (root / "full" / "kustomization.yaml").write_text(WITH_COMPONENT)
    return {"base": _render(kubectl, root / "kubernetes"), "full": _render(kubectl, root / "full")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the real CLI writes from deploy/kubernetes/inferwatch.toml: ``rules/`` and ``grafana/``."""
    out = tmp_path_factory.mktemp("built")
    for command in (["rules", "build"], ["dashboards", "build"]):
        target = out / ("rules" if command[0] == "rules" else "grafana")
        result = _run(sys.executable, "-m", "serving.cli", *command, "--config", CONFIG, "--out", target, cwd=REPO)
        assert result.returncode == 0, result.stderr
    return out


def _of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _is_board(doc: dict[str, Any]) -> bool:
    labels = doc["metadata"].get("labels", {})
    return doc["kind"] == "ConfigMap" and labels.get(DASHBOARD_LABEL[0]) == DASHBOARD_LABEL[1]


def test_every_rendered_object_validates(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Each object validates against the Kubernetes 1.32 schema or its prometheus-operator CRD."""
    errors = [e for doc in rendered["full"] for e in schema_errors(doc)]
    assert errors == []
    assert {d["kind"] for d in rendered["full"]} == {
        "ConfigMap", "Deployment", "Service", "PersistentVolumeClaim", "PodMonitor", "PrometheusRule",
        "AlertmanagerConfig",
    }


def test_the_component_adds_only_the_alertmanager_config(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The base renders without the AlertmanagerConfig; the component adds it, as generated, and nothing else."""
    base, full = rendered["base"], rendered["full"]
    (added,) = [d for d in full if d not in base]
    assert [d for d in full if d is not added] == base
    expected = yaml.safe_load((K8S / "alertmanager-config" / "alertmanagerconfig.yaml").read_text())
    assert added == expected


def test_rendering_matches_the_golden_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The rendered objects, sorted and with each board's JSON as its SHA-256, equal the golden file."""
    docs = copy.deepcopy(rendered["full"])
    for doc in docs:
        if _is_board(doc):
            doc["data"] = {k: "sha256:" + hashlib.sha256(v.encode()).hexdigest() for k, v in doc["data"].items()}
    docs.sort(key=lambda d: (d["apiVersion"], d["kind"], d["metadata"]["name"]))
    assert_golden("kustomize-rendered.yaml", yaml.safe_dump_all(docs, sort_keys=True, width=120))


def test_dashboard_config_maps_hold_what_dashboards_build_writes(
    rendered: dict[str, list[dict[str, Any]]], built: Path
) -> None:
    """One labelled ConfigMap per board, together holding exactly the JSON files ``dashboards build`` wrote."""
    boards = [d for d in rendered["full"] if _is_board(d)]
    assert all(len(d["data"]) == 1 for d in boards)
    held = {name: text for d in boards for name, text in d["data"].items()}
    written = {p.name: p.read_text() for p in (built / "grafana" / "dashboards").glob("*.json")}
    assert held == written
    assert len(boards) == len(written)


def test_sidecar_config_map_is_the_toml_the_deployment_mounts(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The hashed inferwatch-config ConfigMap holds inferwatch.toml, and the Deployment mounts that very name."""
    (config,) = [d for d in _of_kind(rendered["full"], "ConfigMap") if not _is_board(d)]
    assert config["metadata"]["name"].startswith("inferwatch-config-")
    assert config["data"] == {"inferwatch.toml": CONFIG.read_text()}
    (deployment,) = _of_kind(rendered["full"], "Deployment")
    names = [v["configMap"]["name"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert names == [config["metadata"]["name"]]


@pytest.fixture(scope="module")
def operator_rule_files(rendered: dict[str, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each rendered PrometheusRule's spec written as a rule file, ``rules/<name without inferwatch->.yml``."""
    root = tmp_path_factory.mktemp("operator-rules")
    for rule in _of_kind(rendered["full"], "PrometheusRule"):
        path = root / "rules" / f"{rule['metadata']['name'].removeprefix('inferwatch-')}.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return root


def test_prometheus_rules_hold_the_plain_rule_files_groups(operator_rule_files: Path, built: Path) -> None:
    """The PrometheusRules' groups are, file for file, those of the rule files ``rules build`` wrote."""
    ours = {p.name: yaml.safe_load(p.read_text()) for p in (operator_rule_files / "rules").glob("*.yml")}
    plain = {p.name: yaml.safe_load(p.read_text()) for p in (built / "rules" / "rules").glob("*.yml")}
    assert ours == plain


def test_promtool_checks_the_prometheus_rules(operator_rule_files: Path, promtool: Path) -> None:
    """promtool check rules accepts the PrometheusRules' groups (duplicate rules are fatal)."""
    result = _run(promtool, "check", "rules", "--lint=duplicate-rules", "--lint-fatal",
                  *sorted((operator_rule_files / "rules").glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_passes_the_generated_tests_on_the_prometheus_rules(
    operator_rule_files: Path, built: Path, promtool: Path
) -> None:
    """The promtool tests ``rules build`` writes pass against the groups taken from the PrometheusRules."""
    shutil.copytree(built / "rules" / "tests", operator_rule_files / "tests", dirs_exist_ok=True)
    tests = sorted(p.name for p in (operator_rule_files / "tests").glob("*.yml"))
    assert tests
    result = _run(promtool, "test", "rules", *tests, cwd=operator_rule_files / "tests")
    assert result.returncode == 0, result.stdout + result.stderr
