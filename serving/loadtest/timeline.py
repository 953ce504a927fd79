"""The engine during a run: queue, running batch, KV usage, preemptions and GPU power, scraped every second.

The target's ``/metrics`` (or ``--metrics-url``) is read on a fixed interval. vLLM's own
exposition goes through the exporters' parser and normalization (``parse_exposition``,
``normalized``: every vLLM generation, engines summed); the sidecar's goes through its catalog
families, which also carry the GPU power and temperature when the sidecar has NVML. Nothing is
turned into a zero: a value the exposition does not give stays None, and so does every value of a
scrape that failed (vLLM restarting) or of a sidecar whose engine series went stale: the timeline
keeps that sample as a gap, and the plot breaks its lines there instead of drawing a flat one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from exporters.derive import normalized
from exporters.vllm_parse import parse_exposition
from serving.loadtest.pacing import Clock, Sleep

SOURCES = ("vllm", "sidecar", "none")


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One scrape: where it came from (``vllm``, ``sidecar`` or ``none``) and the engine and GPU values."""

    source: str
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None
    gpu_power_w: dict[str, float] = field(default_factory=dict)
    gpu_temperature_c: dict[str, float] = field(default_factory=dict)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def read_exposition(text: str) -> EngineReading:
    """The engine and GPU values of a vLLM or sidecar ``/metrics`` text."""
    snapshot = parse_exposition(text)
    if snapshot.series:
        view = normalized(snapshot)
        return EngineReading("vllm", _number(view["running"]), _number(view["waiting"]), _number(view["kv_usage"]),
                             _number(view["preemptions"]))
    return _read_sidecar(text)


def _read_sidecar(text: str) -> EngineReading:
    states: dict[str, float] = {}
    kv: list[float] = []
    preemptions: list[float] = []
    power: dict[str, float] = {}
    temperature: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # the parser raises ValueError, IndexError, ...: all mean "not an exposition"
        return EngineReading("none")
    for family in families:
        for sample in family.samples:
            if sample.name == ce.ENGINE_REQUESTS.series:
                state = sample.labels.get("state", "")
                states[state] = states.get(state, 0.0) + sample.value
            elif sample.name == ce.KV_USAGE.series:
                kv.append(sample.value)
            elif sample.name == ce.ENGINE_PREEMPTIONS.series:
                preemptions.append(sample.value)
            elif sample.name == cg.GPU_POWER.series:
                power[sample.labels.get("gpu", "")] = sample.value
            elif sample.name == cg.GPU_TEMPERATURE.series:
                temperature[sample.labels.get("gpu", "")] = sample.value
    if not (states or kv or preemptions or power or temperature):
        return EngineReading("none")
    return EngineReading("sidecar", states.get("running"), states.get("waiting"), max(kv) if kv else None,
                         sum(preemptions) if preemptions else None, power, temperature)


@dataclass(frozen=True, slots=True)
class TimelineSample:
    """A reading and when it was taken, in seconds after the start of the run."""

    t_s: float
    reading: EngineReading

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        r = self.reading
        return {"t_s": self.t_s, "source": r.source, "running": r.running, "waiting": r.waiting,
                "kv_usage": r.kv_usage, "preemptions": r.preemptions, "gpu_power_w": dict(r.gpu_power_w),
                "gpu_temperature_c": dict(r.gpu_temperature_c)}


@dataclass(slots=True)
class Timeline:
    """Every scrape of one run (a failed one as a sample without values), plus how many failed."""

    url: str
    interval_s: float
    samples: list[TimelineSample] = field(default_factory=list)
    failures: int = 0
    last_failure: str = ""

    @property
    def source(self) -> str:
        """``vllm`` or ``sidecar`` when any scrape gave engine values, else ``none``."""
        found = {s.reading.source for s in self.samples} - {"none"}
        return "vllm" if "vllm" in found else ("sidecar" if found else "none")

    @property
    def has_gpu(self) -> bool:
        """Whether any scrape carried GPU power or temperature."""
        return any(s.reading.gpu_power_w or s.reading.gpu_temperature_c for s in self.samples)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"url": self.url, "interval_s": self.interval_s, "source": self.source, "gpu": self.has_gpu,
                "failures": self.failures, "last_failure": self.last_failure,
                "samples": [s.to_dict() for s in self.samples]}


async def record(
    timeline: Timeline, session: aiohttp.ClientSession, *, origin: float, clock: Clock, sleep: Sleep
) -> None:
    """Scrape ``timeline.url`` every ``interval_s`` on an absolute schedule until cancelled."""
    timeout = aiohttp.ClientTimeout(total=max(1.0, 2 * timeline.interval_s))
    ticks = 0
    while True:
        taken = clock() - origin
        try:
            async with session.get(timeline.url, timeout=timeout) as reply:
                text = (await reply.read()).decode("utf-8", "replace")
                if reply.status != 200:
                    raise aiohttp.ClientResponseError(reply.request_info, (), status=reply.status)
            timeline.samples.append(TimelineSample(taken, read_exposition(text)))
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            timeline.failures += 1
            timeline.last_failure = f"{type(err).__name__}: {err}"
            timeline.samples.append(TimelineSample(taken, EngineReading("none")))
        ticks += 1
        await sleep(max(0.0, origin + ticks * timeline.interval_s - clock()))
