"""Power and temperature while a load runs: the sidecar's NVML series, read from its /metrics every second.

The baseline profile needs the GPUs under the load, not idle after it, so the mix runs inside a :class:`GpuWatch`.
Power is the GPUs' summed draw averaged over the readings (a reading counts only when every GPU that is up gave
one: a sum missing a GPU is no deployment's power); temperature is the hottest GPU of any reading. The sidecar
refreshes its NVML readings every ``gpu.interval_s`` (5 s by default), so a load should last several of those.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from exporters.catalog.gpu import GPU_EXPORTER_UNSUPPORTED, GPU_EXPORTER_UP, GPU_POWER, GPU_TEMPERATURE, GPU_UP
from serving.prelaunch.sidecar_metrics import Samples, read_samples

POLL_S = 1.0
NAMES = (GPU_EXPORTER_UP.series, GPU_UP.series, GPU_POWER.series, GPU_TEMPERATURE.series,
         GPU_EXPORTER_UNSUPPORTED.series)
NVML_CALLS = {GPU_POWER.series: "nvmlDeviceGetPowerUsage", GPU_TEMPERATURE.series: "nvmlDeviceGetTemperature"}


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """The GPUs during the load; ``missing`` says, one sentence each, what could not be read and why."""

    power_watts: float | None
    power_watts_max: float | None
    temperature_celsius_max: float | None
    gpus: int
    readings: int
    missing: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The profile's GPU keys."""
        return {"power_watts": self.power_watts, "power_watts_max": self.power_watts_max,
                "temperature_celsius_max": self.temperature_celsius_max, "gpus": self.gpus,
                "gpu_readings": self.readings}


@dataclass(slots=True)
class GpuReadings:
    """The scrapes of the sidecar's /metrics taken during the load (None: the URL served no metrics)."""

    scrapes: list[dict[str, Samples] | None] = field(default_factory=list)

    def profile(self, metrics_url: str) -> GpuProfile:
        """Mean and peak summed power, hottest GPU, and what is missing."""
        served = [s for s in self.scrapes if s is not None and GPU_EXPORTER_UP.series in s]
        if not served:
            return GpuProfile(None, None, None, 0, 0, (f"{metrics_url} serves no GPU series (not an inferwatch "
                                                       "sidecar: give --metrics-url the sidecar's /metrics)",))
        if not any(value for s in served for _, value in s[GPU_EXPORTER_UP.series]):
            return GpuProfile(None, None, None, 0, 0, (f"the sidecar at {metrics_url} has no NVML "
                                                       f"({GPU_EXPORTER_UP.series} 0: no GPU driver there)",))
        gpus = max(len(_up(s)) for s in served)
        if not gpus:
            return GpuProfile(None, None, None, 0, 0, (f"the sidecar at {metrics_url} reports no GPU up "
                                                       f"({GPU_UP.series})",))
        sums = [sum(v for _, v in s[GPU_POWER.series]) for s in served if _complete(s, GPU_POWER.series)]
        temperatures = [v for s in served for _, v in s.get(GPU_TEMPERATURE.series, [])]
        missing = tuple(_why_missing(served, name) for name, have in ((GPU_POWER.series, sums),
                                                                       (GPU_TEMPERATURE.series, temperatures))
                        if not have)
        return GpuProfile(sum(sums) / len(sums) if sums else None, max(sums, default=None),
                          max(temperatures, default=None), gpus, len(served), missing)


def _up(scrape: dict[str, Samples]) -> set[str]:
    return {labels.get("gpu", "") for labels, value in scrape.get(GPU_UP.series, []) if value == 1}


def _complete(scrape: dict[str, Samples], name: str) -> bool:
    """Every GPU that is up gave this reading (and at least one did)."""
    have = {labels.get("gpu", "") for labels, _ in scrape.get(name, [])}
    return bool(have) and _up(scrape) <= have


def _why_missing(served: list[dict[str, Samples]], name: str) -> str:
    call = NVML_CALLS[name]
    gpus = sorted(set().union(*(_up(s) - {lb.get("gpu", "") for lb, _ in s.get(name, [])} for s in served)))
    unsupported = sorted({lb.get("gpu", "") for s in served for lb, v in s.get(GPU_EXPORTER_UNSUPPORTED.series, [])
                          if lb.get("call") == call and v > 0})
    reason = (f"NVML does not support {call} on GPU {', '.join(unsupported)}" if unsupported else
              f"{call} gave nothing (see inferwatch_gpu_exporter_errors)")
    return f"{name} missing for GPU {', '.join(gpus)}: {reason}"


class GpuWatch:
    """Reads the sidecar's GPU series at the start, every ``poll_s`` while the block runs, and at the end."""

    def __init__(self, session: aiohttp.ClientSession, metrics_url: str, poll_s: float = POLL_S) -> None:
        self.session = session
        self.metrics_url = metrics_url
        self.poll_s = poll_s
        self.readings = GpuReadings()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GpuWatch:
        await self._read()
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._read()

    def profile(self) -> GpuProfile:
        """What the readings so far show."""
        return self.readings.profile(self.metrics_url)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self._read()

    async def _read(self) -> None:
        self.readings.scrapes.append(await read_samples(self.session, self.metrics_url, *NAMES))


__all__ = ["GpuProfile", "GpuReadings", "GpuWatch"]
