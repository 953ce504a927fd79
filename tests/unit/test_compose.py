"""docker-compose.yml, checked without a container engine.

The schema is the compose-spec JSON schema shipped in the docker-compose 1.29.2 wheel on PyPI
(``compose/config/compose_spec.json``, Apache-2.0), vendored as tests/data/compose_spec.json.
Beyond the schema: every host path a service mounts exists once the build step has run
(``inferwatch rules build --out out/rules`` and ``inferwatch dashboards build --out out/grafana``,
here into a temporary ``out``), and the files the services are told to read are among them.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from alert_rules.build import outputs as rule_outputs
from alert_rules.config import RulesConfig
from dashboards.build import files as dashboard_files
from dashboards.config import DashboardConfig

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
SCHEMA = REPO / "tests/data/compose_spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The parsed compose file."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the build step's output: ``out/rules`` and ``out/grafana`` under a temp directory."""
    root = tmp_path_factory.mktemp("out")
    for prefix, produced in (("rules", rule_outputs(RulesConfig())),
                             ("grafana", dashboard_files(DashboardConfig(), RulesConfig()))):
        for rel, text in produced.items():
            path = root / prefix / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        out.append((source, target))
    return out


def _host_path(source: str, built: Path) -> Path:
    if source.startswith("./out/"):
        return built / source.removeprefix("./out/")
    return REPO / source


def _in_container(service: dict[str, Any], container_path: str, built: Path) -> Path | None:
    """Map a container path to the host file behind it, through the service's bind mounts."""
    for source, target in _mounts(service):
        if source.startswith(".") and (container_path == target or container_path.startswith(target + "/")):
            return _host_path(source, built) / container_path[len(target):].lstrip("/")
    return None


def _schema_errors(data: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)  # the schema's $schema, spelled with a trailing '#'
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(data)]


def test_compose_file_matches_the_compose_spec_schema(compose: dict[str, Any]) -> None:
    """The file validates against the compose-spec JSON schema."""
    assert _schema_errors(compose) == []


def test_schema_rejects_a_misspelled_key(compose: dict[str, Any]) -> None:
    """A service key the spec does not know (``volume`` for ``volumes``) is an error."""
    broken = copy.deepcopy(compose)
    broken["services"]["grafana"]["volume"] = broken["services"]["grafana"].pop("volumes")
    assert any("volume" in e for e in _schema_errors(broken))


def test_every_mounted_path_exists_after_the_build(compose: dict[str, Any], built: Path) -> None:
    """Every bind-mounted host path exists once rules and dashboards are built."""
    missing = []
    for name, service in compose["services"].items():
        for source, _target in _mounts(service):
            if source.startswith(".") and not _host_path(source, built).exists():
                missing.append(f"{name}: {source}")
    assert missing == []


def test_services_read_files_that_the_build_wrote(compose: dict[str, Any], built: Path) -> None:
    """Alertmanager's config, Prometheus' rule glob and Grafana's home board resolve to built files."""
    services = compose["services"]
    am_config = next(a.split("=", 1)[1] for a in services["alertmanager"]["command"] if a.startswith("--config.file"))
    assert _in_container(services["alertmanager"], am_config, built).is_file()
    prom_config_path = next(a.split("=", 1)[1] for a in services["prometheus"]["command"]
                            if a.startswith("--config.file"))
    prom_config = yaml.safe_load(_in_container(services["prometheus"], prom_config_path, built).read_text())
    for pattern in prom_config["rule_files"]:
        directory = _in_container(services["prometheus"], pattern.rsplit("/", 1)[0], built)
        assert [p for p in directory.iterdir() if fnmatch.fnmatch(p.name, pattern.rsplit("/", 1)[1])]
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _in_container(services["grafana"], home, built).is_file()


def test_prometheus_jobs_match_the_dashboard_config(compose: dict[str, Any], built: Path) -> None:
    """Prometheus scrapes the sidecar, vLLM and itself under the job names the boards filter on."""
    service = compose["services"]["prometheus"]
    prom = yaml.safe_load(_in_container(service, "/etc/prometheus/prometheus.yml", built).read_text())
    jobs = {job["job_name"] for job in prom["scrape_configs"]}
    config = DashboardConfig()
    assert {config.sidecar_job, config.vllm_job, config.prometheus_job} <= jobs


def test_grafana_datasources_point_at_compose_services(compose: dict[str, Any]) -> None:
    """The provisioned Prometheus and trace URLs name services of the compose file."""
    config = DashboardConfig()
    for url in (config.prometheus_url, config.trace_url):
        host = url.split("//", 1)[1].split(":", 1)[0]
        assert host in compose["services"]


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_each_profile_runs_one_vllm_and_one_sidecar(compose: dict[str, Any], profile: str) -> None:
    """Each profile starts exactly one service answering as ``vllm`` and one as ``sidecar``."""
    active = {n: s for n, s in compose["services"].items() if profile in s.get("profiles", [profile])}
    for alias in ("vllm", "sidecar"):
        answering = [n for n, s in active.items()
                     if n == alias or alias in s.get("networks", {}).get("default", {}).get("aliases", [])]
        assert len(answering) == 1, (profile, alias, answering)


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    """No service runs an unpinned or ``latest`` image."""
    for name, service in compose["services"].items():
        image = service.get("image", "")
        tag = image.rsplit(":", 1)[-1].rstrip("}") if ":" in image else ""
        assert tag not in ("", "latest"), name


def test_vllm_services_send_their_spans_to_jaegers_otlp(compose: dict[str, Any]) -> None:
    """Both vLLM services export traces over OTLP/HTTP to the jaeger service, as the sidecar does."""
    sidecar_endpoint = next(a.split("=", 1)[1] for a in compose["services"]["sidecar-cpu"]["command"]
                            if a.startswith("--tracing-otlp-endpoint="))
    jaeger_ports = {p.split(":")[-1] for p in compose["services"]["jaeger"]["ports"]}
    for name in ("vllm", "vllm-cpu"):
        service = compose["services"][name]
        endpoint = next(a.split("=", 1)[1] for a in service["command"] if a.startswith("--otlp-traces-endpoint="))
        assert endpoint == sidecar_endpoint, name
        assert endpoint.split("//", 1)[1].split(":", 1)[0] == "jaeger"
        assert endpoint.split(":")[2].split("/", 1)[0] in jaeger_ports
        assert service["environment"]["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf", name


def test_each_sidecar_starts_after_its_profiles_vllm(compose: dict[str, Any]) -> None:
    """A sidecar depends on the vLLM of its own profile, and every long-running service has a health check."""
    services = compose["services"]
    assert services["sidecar"]["depends_on"] == ["vllm"]
    assert services["sidecar-cpu"]["depends_on"] == ["vllm-cpu"]
    for name, service in services.items():
        for dependency in service.get("depends_on", []):  # never a service another profile leaves out
            assert services[dependency].get("profiles", service.get("profiles")) == service.get("profiles"), name
    for name in ("vllm", "vllm-cpu", "sidecar", "sidecar-cpu", "prometheus", "alertmanager"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name


OVERRIDE = REPO / "deploy/compose/docker-compose.override.yml"


def test_the_compose_test_override_only_swaps_images_and_the_model(compose: dict[str, Any]) -> None:
    """`make compose-test`'s override names existing services and sets only ``image`` and a read-only model mount."""
    override = yaml.safe_load(OVERRIDE.read_text())
    assert set(override) == {"services"}
    merged = copy.deepcopy(compose)
    for name, service in override["services"].items():
        assert name in compose["services"], name
        assert set(service) <= {"image", "volumes"}, name
        for volume in service.get("volumes", []):
            source, target, mode = volume.split(":")
            assert name == "vllm-cpu", volume
            assert target.startswith("/models/"), volume
            assert mode == "ro", volume
            assert source.startswith("./build/"), volume
        merged["services"][name].update(image=service["image"])
    assert _schema_errors(merged) == []
    assert _schema_errors(override) == []
