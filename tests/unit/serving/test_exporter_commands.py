"""Tests of `inferwatch metrics derive` and `inferwatch gpu snapshot` (kept with the exporters they front)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest

from serving.cli import main
from tests.fakes.nvml import FakeNvml

DATA = Path(__file__).resolve().parents[2] / "data"
FIELDS = {
    "generation", "models", "running", "waiting", "swapped", "preemptions", "kv_usage", "blocks_total",
    "blocks_used", "block_size", "prefix_hit_ratio", "prefill_seconds", "decode_seconds",
}


def test_metrics_derive_json_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with every normalized field, null where the text does not say."""
    assert main(["metrics", "derive", str(DATA / "vllm_v1_engine_0.32.prom"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert set(view) >= FIELDS
    assert view["swapped"] is None
    assert view["blocks_total"] == 65


def test_metrics_derive_table(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json the view is a two-column table naming the generation."""
    assert main(["metrics", "derive", str(DATA / "vllm_v0_0.6.6.prom")]) == 0
    out = capsys.readouterr().out
    assert "generation        v0" in out
    assert "swapped           1" in out


def test_metrics_derive_without_vllm_families_exits_1(tmp_path: Path) -> None:
    """A text without any vLLM family is reported with exit code 1."""
    path = tmp_path / "other.prom"
    path.write_text("# TYPE up gauge\nup 1\n")
    assert main(["metrics", "derive", str(path)]) == 1


def test_metrics_derive_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable FILE is a usage error (exit 2) that names the file."""
    assert main(["metrics", "derive", "/nonexistent/metrics.prom"]) == 2
    assert "/nonexistent/metrics.prom" in capsys.readouterr().err


def test_gpu_snapshot_without_nvml_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No NVML library gives a clear message and exit code 1."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound))
    assert main(["gpu", "snapshot"]) == 1
    assert "NVML is unavailable" in capsys.readouterr().err


def test_gpu_snapshot_json_lists_every_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With NVML present --json lists one reading per GPU in base units."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(3))
    assert main(["gpu", "snapshot", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [g["index"] for g in payload["gpus"]] == [0, 1, 2]
    assert payload["gpus"][0]["power_watts"] == 350.0
