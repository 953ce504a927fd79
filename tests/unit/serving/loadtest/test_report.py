"""The report directory: report.md, report.json and PNG plots that decode and show the expected series."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from PIL import Image

from serving.loadtest.capacity import SloTarget
from serving.loadtest.plots import PALETTE
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.report import ReportContext, build_document, write_report
from serving.loadtest.spec import LoadSpec
from serving.loadtest.steps import run_steps
from tests.fakes.openai_upstream import FakeOpenAI

SIDECAR_METRICS = "\n".join([
    "# TYPE inferwatch_engine_requests gauge",
    'inferwatch_engine_requests{model_name="m",state="running"} 2',
    'inferwatch_engine_requests{model_name="m",state="waiting"} 1',
    "# TYPE inferwatch_kv_cache_usage_ratio gauge",
    'inferwatch_kv_cache_usage_ratio{model_name="m"} 0.5',
    "# TYPE inferwatch_engine_preemptions_total counter",
    'inferwatch_engine_preemptions_total{model_name="m"} 3',
    "# TYPE inferwatch_gpu_power_usage_watts gauge",
    'inferwatch_gpu_power_usage_watts{gpu="0",uuid="GPU-a"} 250',
    "# TYPE inferwatch_gpu_temperature_celsius gauge",
    'inferwatch_gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 60',
]) + "\n"


def colors_in(path: Path) -> set[str]:
    """The palette colours that some pixel of the PNG has exactly."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(np.uint32).reshape(-1, 3)
    present = set(np.unique((pixels[:, 0] << 16) | (pixels[:, 1] << 8) | pixels[:, 2]).tolist())
    return {color for color in PALETTE if int(color[1:], 16) in present}


async def _write_report(directory: Path) -> tuple[Path, dict[str, Any], FakeOpenAI]:
    fake = FakeOpenAI(count_prompt_words=True, model_name="m", max_model_len=4096, token_delay_s=0.002,
                      latency_per_in_flight_s=0.01, metrics_text=SIDECAR_METRICS)
    server = TestServer(fake.app())
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        base = LoadSpec(url=url, model="m", requests=30, max_tokens=4, ignore_eos=True)
        options = LoadOptions(base=base, concurrency=(1, 4), mix="16:2,64:1,200:1", metrics_url=url + "/metrics",
                              scrape_interval_s=0.05)
        plan, calibration = await prepare(options, say=lambda _: None)
        run = await run_steps(plan)
    finally:
        await server.close()
    document = build_document(run, ReportContext(SloTarget(0.5, 0.9), expected_rpm=600.0,
                                                 calibration=calibration, options={"mix": "16:2,64:1,200:1"}))
    write_report(directory, document)
    return directory, json.loads((directory / "report.json").read_text()), fake


@pytest.fixture(name="report_dir", scope="module")
def _report_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], FakeOpenAI]:
    """One report of a two-step mixed run on the fake upstream, shared by the tests of this module."""
    return asyncio.run(_write_report(tmp_path_factory.mktemp("report")))


class TestReportFiles:
    """What a --report directory holds."""

    def test_files_and_pngs_decode(self, report_dir: tuple[Path, dict[str, Any], FakeOpenAI]) -> None:
        """report.md, report.json and four PNGs; every PNG decodes to a non-empty image."""
        directory, document, _ = report_dir
        names = {p.name for p in directory.iterdir()}
        assert names == {"report.md", "report.json", "throughput_vs_p99.png", "latency_cdf.png", "timeline.png",
                         "gpu.png"}
        for plot in document["plots"]:
            with Image.open(directory / plot["file"]) as image:
                image.verify()
            with Image.open(directory / plot["file"]) as image:
                assert image.format == "PNG"
                assert image.size[0] > 300
                assert image.size[1] > 300

    def test_each_plot_shows_its_expected_series(self, report_dir: tuple[Path, dict[str, Any], FakeOpenAI]) -> None:
        """p99 e2e and TTFT; one CDF per length bucket; TTFT, waiting, running, KV, preemptions; power and
        temperature of the one GPU: as many series colours in each image."""
        directory, document, _ = report_dir
        expected = {"throughput_vs_p99.png": 2, "latency_cdf.png": 3, "timeline.png": 5, "gpu.png": 2}
        plots = {p["file"]: p for p in document["plots"]}
        for name, count in expected.items():
            assert len(plots[name]["series"]) == count, plots[name]
            assert len(colors_in(directory / name)) == count, name

    def test_numbers_are_sane_and_tokens_match_the_upstream(
        self, report_dir: tuple[Path, dict[str, Any], FakeOpenAI]
    ) -> None:
        """p99 >= p50 everywhere, throughput > 0, token totals equal the upstream's usage sums."""
        _, document, fake = report_dir
        for step in document["steps"]:
            summary = step["summary"]
            for key in ("ttft_s", "itl_s", "e2e_s"):
                assert summary[key]["p99"] >= summary[key]["p50"] > 0
            assert summary["requests_per_s"] > 0
            assert summary["output_tokens_per_s"] > 0
        totals = document["totals"]
        assert totals["sent"] == totals["ok"] == 60 == len(document["samples"])
        assert totals["prompt_tokens"] == fake.usage_prompt_tokens
        assert totals["completion_tokens"] == fake.usage_completion_tokens == 60 * 4
        assert {s["bucket"] for s in document["samples"]} == {"16", "64", "200"}
        assert document["timeline"]["source"] == "sidecar"
        assert document["gpu"]["available"] is True

    def test_capacity_and_provisioning_are_reported(
        self, report_dir: tuple[Path, dict[str, Any], FakeOpenAI]
    ) -> None:
        """The capacity step's rpm is its throughput; provisioning follows the headroom rule."""
        directory, document, _ = report_dir
        best = document["capacity"]
        assert best is not None
        step = next(s for s in document["steps"] if s["label"] == best["step"])
        assert best["rpm"] == pytest.approx(step["summary"]["requests_per_s"] * 60)
        plan = document["provisioning"]
        assert plan["needed_rpm"] == pytest.approx(600 * 1.6)
        text = (directory / "report.md").read_text()
        assert f"{best['rpm']:.1f} requests/min" in text
        missed = [s["label"] for s in document["steps"] if not s["verdict"]["meets_slo"]]
        assert best["lower_bound"] is (not missed)  # no step missed: the capacity is only 'at least'
        assert (f"Capacity: at least {best['rpm']:.1f} requests/min" in text) is best["lower_bound"]
        assert ("at most " in text) is best["lower_bound"]  # fewer deployments may do
        assert "![The run over time](timeline.png)" in text
        assert "GPU power and temperature from" in text


def test_preemptions_since_start_survive_a_counter_reset() -> None:
    """vLLM's counter starts again at 0 after a restart: the plotted increase keeps counting from where it was."""
    from serving.loadtest.plots import increase

    points = [(0.0, 5.0), (1.0, 7.0), (2.0, 7.0), (3.0, 1.0), (4.0, 4.0)]
    assert increase(points) == [(0.0, 0.0), (1.0, 2.0), (2.0, 2.0), (3.0, 3.0), (4.0, 6.0)]
