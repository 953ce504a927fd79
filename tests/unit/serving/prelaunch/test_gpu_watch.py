"""The baseline's GPU readings: the real NVML exporter over the fake NVML, read back through /metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from exporters.collectors import GpuCollector, register_collectors
from exporters.nvml import NvmlReader
from serving.prelaunch.gpu_watch import GpuProfile, GpuWatch
from tests.fakes.nvml import FakeNvml

Exposition = Callable[[], bytes]


def _exposition(fake: FakeNvml | None, *, nvml: bool = True) -> Exposition:
    """What the sidecar's /metrics shows of the fake's GPUs (read anew at each scrape); None: no GPU reading yet,
    or no NVML at all (``nvml`` False)."""
    registry = CollectorRegistry()
    if fake is None:
        register_collectors(registry, GpuCollector(lambda: None, lambda: nvml))
    else:
        reader = NvmlReader(fake)
        reader.open()
        register_collectors(registry, GpuCollector(reader.read, lambda: True))
    return lambda: generate_latest(registry)


async def _watch(text: Exposition, during: Callable[[], None] = lambda: None) -> GpuProfile:
    """Serve ``text`` as /metrics and watch it while ``during`` changes the fake, twice, between readings."""
    app = web.Application()

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=text(), content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        async with aiohttp.ClientSession() as session, GpuWatch(session, url, poll_s=0.02) as watch:
            for _ in range(2):
                await asyncio.sleep(0.05)
                during()
        return watch.profile()
    finally:
        await runner.cleanup()


@pytest.fixture
def fake() -> FakeNvml:
    """Two GPUs with powers and temperatures of their own."""
    nvml = FakeNvml(2)
    nvml.gpus[0].power_mw, nvml.gpus[1].power_mw = 300_000, 250_500
    nvml.gpus[0].temperature, nvml.gpus[1].temperature = 51, 67
    return nvml


async def test_power_is_the_gpus_summed_draw_and_temperature_the_hottest(fake: FakeNvml) -> None:
    """NVML's milliwatts become watts summed over the GPUs; the peak and the hottest reading are kept."""
    def load_rises() -> None:
        fake.gpus[1].power_mw += 100_000
        fake.gpus[0].temperature += 20

    profile = await _watch(_exposition(fake), load_rises)
    assert (profile.gpus, profile.missing) == (2, ())
    assert profile.readings >= 2  # the start and the end at least
    assert profile.power_watts is not None
    assert 550.5 < profile.power_watts < 750.5
    assert profile.power_watts_max == 750.5
    assert profile.temperature_celsius_max == 91


async def test_a_gpu_without_power_leaves_no_power_and_says_why(fake: FakeNvml) -> None:
    """NVMLError_NotSupported for one GPU's power: a sum without it is no deployment's power, so none; the
    temperature stays."""
    fake.gpus[1].unsupported.add("nvmlDeviceGetPowerUsage")
    profile = await _watch(_exposition(fake))
    assert (profile.power_watts, profile.power_watts_max, profile.temperature_celsius_max) == (None, None, 67)
    assert profile.missing == ("inferwatch_gpu_power_usage_watts missing for GPU 1: NVML does not support "
                               "nvmlDeviceGetPowerUsage on GPU 1",)


async def test_no_nvml_and_no_sidecar_are_named() -> None:
    """A sidecar without NVML says so; a /metrics without GPU series (vLLM's own) points at --metrics-url."""
    none = await _watch(_exposition(None, nvml=False))
    assert (none.power_watts, none.temperature_celsius_max) == (None, None)
    assert "has no NVML (inferwatch_gpu_exporter_up 0" in none.missing[0]
    other = await _watch(lambda: b"vllm:num_requests_running 0\n")
    assert "serves no GPU series" in other.missing[0]
    assert "--metrics-url" in other.missing[0]


async def test_nvml_without_a_gpu_reading_says_so() -> None:
    """NVML is up but the sidecar has read no GPU (none found, or its first reading not taken yet)."""
    profile = await _watch(_exposition(None))
    assert (profile.power_watts, profile.gpus) == (None, 0)
    assert "reports no GPU up (inferwatch_gpu_up)" in profile.missing[0]
