"""promtool accepts the compose stack's Prometheus config with its extra-upstream job taken in (and as shipped)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.deploy.test_extra_upstream_examples import COMPOSE_PROMETHEUS, uncommented

pytestmark = pytest.mark.real_server


@pytest.mark.parametrize("example", [True, False], ids=["with the extra-upstream job", "as shipped"])
def test_promtool_accepts_the_compose_scrape_config(promtool: Path, tmp_path: Path, example: bool) -> None:
    """``promtool check config`` passes the config, with the commented multi-target job taken in and without."""
    text = COMPOSE_PROMETHEUS.read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(uncommented(text) if example else text)
    checked = subprocess.run([str(promtool), "check", "config", "--syntax-only", str(config)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ("inferwatch-upstreams" in config.read_text().replace("#- job_name: inferwatch-upstreams", "")) == example
