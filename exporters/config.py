"""Configuration sections owned by the exporters: upstream scraping, GPUs, the upstream process."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporters.configuring import non_negative, positive, setting


def _regex(value: Any) -> str | None:
    try:
        re.compile(value)
    except re.error as err:
        return f"must be a valid regular expression ({err})"
    return None


def _path(value: Any) -> str | None:
    return None if value.startswith("/") else "must start with /"


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Section ``[scrape]``: how the sidecar reads each upstream's ``/metrics`` (main, long lane, canary, shadow)."""

    enabled: bool = setting(
        True, "Scrape the upstream's /metrics (and each extra upstream's: long lane, canary, shadow) and export "
        "the derived engine signals.",
    )
    interval_s: float = setting(5.0, "Seconds between scrapes of the upstream's /metrics.", check=positive)
    timeout_s: float = setting(3.0, "Seconds before a scrape of the upstream is abandoned.", check=positive)
    path: str = setting("/metrics", "Path of the upstream's Prometheus endpoint.", check=_path)
    max_bytes: int = setting(
        16 * 1024 * 1024, "Largest /metrics body read from the upstream, in bytes; a larger one fails.",
        check=positive,
    )
    stale_after_failures: int = setting(
        3, "Consecutive failed scrapes after which the engine series (those derived from the upstream's "
        "/metrics) leave the sidecar's /metrics, so Prometheus marks them stale; they also leave at once "
        "when a readiness probe finds the upstream not ready (an answer other than 200, or nothing "
        "listening). One slow scrape of a busy engine does not drop them.",
        check=positive,
    )


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """Section ``[gpu]``: the NVML exporter."""

    enabled: bool = setting(True, "Run the NVML GPU exporter (disabled by itself when NVML is missing).")
    interval_s: float = setting(5.0, "Seconds between NVML readings.", check=positive)
    serving_gpus: list[str] = setting(
        [], "GPUs (UUIDs or indexes) that serve the upstream, for tokens per joule; empty = all."
    )
    xid_events: bool = setting(True, "Count XID errors from an NVML event thread.")
    event_timeout_ms: int = setting(
        500, "Milliseconds the XID event thread waits per poll (bounds shutdown time).", check=positive
    )


@dataclass(frozen=True, slots=True)
class ProcessConfig:
    """Section ``[upstream_process]``: health of the vLLM process itself."""

    pid: int = setting(0, "PID of the vLLM API server to watch; 0 = use name_pattern.", check=non_negative)
    name_pattern: str = setting(
        "", "Regular expression matched against process command lines to find vLLM; empty = off.",
        check=_regex,
    )
    interval_s: float = setting(5.0, "Seconds between readings of the upstream process.", check=positive)
