"""Everything ``rules build`` writes passes promtool and amtool, and the same tests pass our evaluator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alert_rules.build import write_all
from serving.config import build_settings
from tests.conftest import require
from tests.harness import servers

pytestmark = pytest.mark.real_server

CONFIGS = {
    "defaults": {},
    "tuned": {
        "serve": {"length_bucket_edges": [1024, 4096, 16384]},
        "rules": {
            "sla_seconds": {"llama": 4.0, "qwen": 12.0}, "sla_default_s": 8.0, "swap_for_s": 120,
            "kv_cache_ratio": 0.8, "kv_cache_for_s": 90, "rollback_error_ratio": 0.05,
            "breaker_keep_firing_for_s": 120, "long_context_tokens": 4096, "slo_objective": 0.995,
            "slo_latency_threshold_s": 5.0, "max_num_seqs": 8, "oom_count": 2, "oom_window_s": 20,
            "upstream_down_for_s": 45, "service": "chat",
        },
    },
}


@pytest.fixture(params=sorted(CONFIGS), name="built")
def _built(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    write_all(build_settings(CONFIGS[request.param]), tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def amtool() -> Path:
    """Path of Debian's amtool (missing: fails under CI, skips elsewhere)."""
    return require(lambda: servers.require_binary(servers.AMTOOL))


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_promtool_checks_the_rule_files(built: Path, promtool: Path) -> None:
    """promtool check rules accepts every generated rule file (and lints no duplicates)."""
    result = _run(promtool, "check", "rules", "--lint=duplicate-rules", "--lint-fatal",
                  *sorted((built / "rules").glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_passes_every_generated_test(built: Path, promtool: Path) -> None:
    """promtool test rules passes each generated unit-test file."""
    tests = sorted((built / "tests").glob("*.yml"))
    assert tests
    result = _run(promtool, "test", "rules", *[t.name for t in tests], cwd=built / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_embedded_evaluator_passes_the_same_tests(built: Path) -> None:
    """inferwatch rules test passes the very files promtool passed."""
    tests = sorted((built / "tests").glob("*.yml"))
    result = _run(sys.executable, "-m", "serving.cli", "rules", "test", *[t.name for t in tests],
                  cwd=built / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_config(built: Path, amtool: Path) -> None:
    """amtool check-config accepts alertmanager.yml."""
    result = _run(amtool, "check-config", built / "alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("severity", "receiver"), [("critical", "page"), ("warning", "ticket"), ("info", "info")],
    ids=["critical pages", "warning opens a ticket", "info is advice"],
)
def test_amtool_routes_each_severity(built: Path, amtool: Path, severity: str, receiver: str) -> None:
    """amtool routes each severity to its receiver."""
    result = _run(amtool, "config", "routes", "test", f"--config.file={built / 'alertmanager.yml'}",
                  f"--verify.receivers={receiver}", f"severity={severity}", "service=vllm")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_generated_test_fails_under_promtool(built: Path, promtool: Path) -> None:
    """Expecting an alert while it is still pending makes promtool fail: the generated tests can fail."""
    text = (built / "tests" / "InferwatchQueueBacklog.yml").read_text()
    broken = built / "tests" / "broken.yml"
    broken.write_text(text.replace("exp_alerts: []", "exp_alerts: [{exp_labels: {x: y}}]", 1))
    result = _run(promtool, "test", "rules", broken.name, cwd=built / "tests")
    assert result.returncode == 1
    ours = _run(sys.executable, "-m", "serving.cli", "rules", "test", broken.name, cwd=built / "tests")
    assert ours.returncode == 1


def test_promtool_expands_the_context_annotation_exactly(tmp_path: Path, promtool: Path) -> None:
    """Prometheus' own templates expand the context annotation to the very strings the embedded engine gives."""
    from tests.unit.alert_rules.test_context_rules import context_test_file

    path = context_test_file(tmp_path)
    result = _run(promtool, "test", "rules", path.name, cwd=path.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_agrees_on_the_engine_signal_cases(tmp_path: Path, promtool: Path) -> None:
    """The wedged-engine and admission-rejection cases the embedded evaluator passes, promtool passes."""
    from tests.unit.alert_rules.test_engine_signal_rules import signals_test_file

    path = signals_test_file(tmp_path)
    result = _run(promtool, "test", "rules", path.name, cwd=path.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_agrees_on_the_slo_evidence_cases(tmp_path: Path, promtool: Path) -> None:
    """Three failures and a failing /v1/models page nobody, a total outage pages in time: promtool agrees."""
    from tests.unit.alert_rules.test_slo_evidence import evidence_test_file

    path = evidence_test_file(tmp_path)
    result = _run(promtool, "test", "rules", path.name, cwd=path.parent)
    assert result.returncode == 0, result.stdout + result.stderr
