"""Configuration sections owned by the exporters: upstream scraping, GPUs, the upstream process."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configuring import positive, setting


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Section ``[scrape]``: how the sidecar reads the upstream's ``/metrics``."""

    interval_s: float = setting(5.0, "Seconds between scrapes of the upstream's /metrics.", check=positive)
    timeout_s: float = setting(3.0, "Seconds before a scrape of the upstream is abandoned.", check=positive)
    path: str = setting("/metrics", "Path of the upstream's Prometheus endpoint.")


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """Section ``[gpu]``: the NVML exporter."""

    enabled: bool = setting(True, "Run the NVML GPU exporter (disabled by itself when NVML is missing).")
    interval_s: float = setting(5.0, "Seconds between NVML readings.", check=positive)
    serving_gpus: list[str] = setting(
        [], "GPUs (UUIDs or indexes) that serve the upstream, for tokens per joule; empty = all."
    )


@dataclass(frozen=True, slots=True)
class ProcessConfig:
    """Section ``[upstream_process]``: health of the vLLM process itself."""

    pid: int = setting(0, "PID of the vLLM API server to watch; 0 = use name_pattern.")
    name_pattern: str = setting(
        "", "Regular expression matched against process command lines to find vLLM; empty = off."
    )
