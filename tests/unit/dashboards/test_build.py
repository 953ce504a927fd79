"""Building the boards: stable output, thresholds from the rules config, provisioning files, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from alert_rules.config import RulesConfig
from dashboards.build import SCHEMA_VERSION, dashboards, datasources, files, write
from dashboards.config import DashboardConfig
from exporters.configuring import from_mapping
from exporters.errors import ConfigError
from serving.cli import main


def _panel(data: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in data["panels"] if p["title"] == title)


def _threshold_values(panel: dict[str, Any]) -> list[float | None]:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_build_is_deterministic_with_stable_uids() -> None:
    """Two builds give the same bytes, and uids are the prefix plus the board key."""
    first = files(DashboardConfig(), RulesConfig())
    assert first == files(DashboardConfig(), RulesConfig())
    uids = sorted(json.loads(t)["uid"] for p, t in first.items() if p.endswith(".json"))
    assert uids == ["inferwatch-engine", "inferwatch-gpu", "inferwatch-pipeline", "inferwatch-slo",
                    "inferwatch-tenants"]


def test_json_has_sorted_keys_and_current_schema() -> None:
    """Dashboard files are written with sorted keys, schema 39 and no grafanalib legacy keys."""
    for path, text in files(DashboardConfig(), RulesConfig()).items():
        if not path.endswith(".json"):
            continue
        data = json.loads(text)
        assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        assert data["schemaVersion"] == SCHEMA_VERSION
        assert not {"rows", "__inputs", "sharedCrosshair", "hideControls"} & set(data)


def test_thresholds_follow_the_rules_config() -> None:
    """Changing RulesConfig moves the lines drawn on the error, GPU memory and KV panels."""
    rules = from_mapping(RulesConfig, {"degrade_error_ratio": 0.02, "rollback_error_ratio": 0.07,
                                       "gpu_memory_ratio": 0.85, "kv_cache_ratio": 0.8}, "rules")
    built = dashboards(DashboardConfig(), rules)
    assert _threshold_values(_panel(built["inferwatch-slo.json"], "Error ratio"))[1:] == [0.02, 0.07]
    assert _threshold_values(_panel(built["inferwatch-gpu.json"], "GPU memory used share"))[1:] == [0.85]
    assert _threshold_values(_panel(built["inferwatch-engine.json"], "KV cache usage"))[1:] == [0.8]
    gpu_memory = _panel(built["inferwatch-gpu.json"], "GPU memory used and total")
    assert any(t["expr"].endswith("* 0.85") for t in gpu_memory["targets"])


def test_slo_panels_use_the_objective_and_period() -> None:
    """The SLO stat panels compute over the configured period and budget."""
    rules = from_mapping(RulesConfig, {"slo_objective": 0.99, "slo_period_days": 28}, "rules")
    board = dashboards(DashboardConfig(), rules)["inferwatch-slo.json"]
    budget = _panel(board, "Error budget left")["targets"][0]["expr"]
    assert "[28d]" in budget
    assert budget.endswith("/ 0.01)")
    assert _threshold_values(_panel(board, "SLO compliance"))[1:] == [0.99]


def test_latency_panels_carry_exemplars() -> None:
    """TTFT, inter-token and end-to-end latency targets ask Grafana for exemplars."""
    board = dashboards(DashboardConfig(), RulesConfig())["inferwatch-slo.json"]
    for title in ("Time to first token", "Inter-token latency", "End-to-end latency"):
        assert all(t["exemplar"] for t in _panel(board, title)["targets"])


def test_exemplar_links_point_at_the_trace_datasource() -> None:
    """The Prometheus datasource's exemplar destination is the provisioned trace datasource."""
    config = from_mapping(DashboardConfig, {"trace_backend": "tempo", "trace_url": "http://tempo:3200"},
                          "dashboards")
    provisioned = datasources(config)["datasources"]
    prometheus, traces = provisioned
    destination = prometheus["jsonData"]["exemplarTraceIdDestinations"][0]
    assert destination == {"name": "trace_id", "datasourceUid": traces["uid"]}
    assert (traces["type"], traces["url"]) == ("tempo", "http://tempo:3200")


def test_exemplars_also_link_to_the_sidecars_explanation_when_its_url_is_set() -> None:
    """With dashboards.explain_base_url, a second exemplar destination opens BASE/admin/requests/<trace id> (the
    route `inferwatch explain` reads); without it, none."""
    assert len(datasources(DashboardConfig())["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"]) == 1
    config = from_mapping(DashboardConfig, {"explain_base_url": "http://sidecar:9100/"}, "dashboards")
    _, explain = datasources(config)["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"]
    assert explain == {"name": "trace_id", "url": "http://sidecar:9100/admin/requests/${__value.raw}",
                       "urlDisplayLabel": "Explain this request"}
    with pytest.raises(ConfigError, match=r"dashboards\.explain_base_url"):
        from_mapping(DashboardConfig, {"explain_base_url": "sidecar:9100"}, "dashboards")


def test_bad_dashboard_config_names_the_key() -> None:
    """An unknown trace backend is a ConfigError naming dashboards.trace_backend."""
    with pytest.raises(ConfigError, match=r"dashboards\.trace_backend"):
        from_mapping(DashboardConfig, {"trace_backend": "zipkin"}, "dashboards")


def test_write_creates_every_file(tmp_path: Path) -> None:
    """write() puts the boards and both provisioning files under the directory."""
    paths = write(tmp_path, DashboardConfig(), RulesConfig())
    rel = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert rel == [
        "dashboards/inferwatch-engine.json", "dashboards/inferwatch-gpu.json",
        "dashboards/inferwatch-pipeline.json", "dashboards/inferwatch-slo.json", "dashboards/inferwatch-tenants.json",
        "provisioning/dashboards/inferwatch.yaml", "provisioning/datasources/inferwatch.yaml",
    ]
    provider = yaml.safe_load((tmp_path / "provisioning/dashboards/inferwatch.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == DashboardConfig().grafana_dashboards_path


def test_cli_build_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inferwatch dashboards build --out DIR` exits 0 and lists what it wrote."""
    assert main(["dashboards", "build", "--out", str(tmp_path), "--dashboards-uid-prefix", "team1"]) == 0
    assert (tmp_path / "dashboards/team1-slo.json").exists()
    assert "team1-gpu.json" in capsys.readouterr().out


def test_cli_bad_config_exits_2(tmp_path: Path) -> None:
    """A bad value in the config file is exit code 2."""
    config = tmp_path / "bad.toml"
    config.write_text('[dashboards]\ntrace_backend = "zipkin"\n')
    assert main(["dashboards", "build", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
