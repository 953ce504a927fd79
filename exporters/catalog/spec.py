"""The :class:`MetricSpec` value: everything about one metric family in one place."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class MetricType(enum.StrEnum):
    """Prometheus metric types used by inferwatch."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


class Source(enum.StrEnum):
    """Who exposes a family."""

    SIDECAR = "sidecar"  # inferwatch's own /metrics
    VLLM = "vllm"  # the vLLM server's /metrics (read, never re-exported under vLLM's name)
    SGLANG = "sglang"  # SGLang's /metrics (read, normalized into the engine series)
    LLAMACPP = "llamacpp"  # llama.cpp's llama-server --metrics (read, normalized into the engine series)
    RECORDING = "recording"  # written by inferwatch's recording rules (Prometheus or the embedded engine)
    PROMETHEUS = "prometheus"  # written or exposed by Prometheus itself (read by dashboards only)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family.

    ``name`` is the family name as prometheus_client declares it: counters *without* the
    ``_total`` suffix (``inferwatch_requests`` exposes ``inferwatch_requests_total``),
    histograms without ``_bucket``/``_sum``/``_count``. Use the properties to spell series.

    ``aliases`` maps a vLLM generation (``"v0"``, ``"v1"``, ``"v1_engine"``) to the family
    name that generation used, when it differs from ``name``.
    """

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] | None = None
    source: Source = Source.SIDECAR
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def series(self) -> str:
        """The sample name to query: ``_total`` added for counters, plain otherwise."""
        if self.type is MetricType.COUNTER and not self.name.endswith("_total"):
            return f"{self.name}_total"
        if self.type is MetricType.INFO:
            return f"{self.name}_info" if not self.name.endswith("_info") else self.name
        return self.name

    @property
    def bucket(self) -> str:
        """``<name>_bucket`` of a histogram."""
        self._need_histogram()
        return f"{self.name}_bucket"

    @property
    def sum(self) -> str:
        """``<name>_sum`` of a histogram."""
        self._need_histogram()
        return f"{self.name}_sum"

    @property
    def count(self) -> str:
        """``<name>_count`` of a histogram."""
        self._need_histogram()
        return f"{self.name}_count"

    def sample_names(self) -> tuple[str, ...]:
        """Every sample name this family exposes."""
        if self.type is MetricType.HISTOGRAM:
            return (self.bucket, self.sum, self.count)
        return (self.series,)

    def _need_histogram(self) -> None:
        if self.type is not MetricType.HISTOGRAM:
            raise TypeError(f"{self.name} is a {self.type}, not a histogram")
