"""Health of the upstream vLLM process itself: memory, restarts, out-of-memory events."""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

G, C = MetricType.GAUGE, MetricType.COUNTER

PROCESS_UP = MetricSpec(
    "inferwatch_upstream_process_up", G,
    "1 when the configured vLLM process (upstream_process.pid or name_pattern) was found, else 0.",
)
PROCESS_COUNT = MetricSpec(
    "inferwatch_upstream_process_count", G,
    "Processes of the upstream: the API server found by pid or name pattern plus its descendants "
    "(engine core, workers).",
    (), "processes",
)
PROCESS_RESIDENT_MEMORY = MetricSpec(
    "inferwatch_upstream_process_resident_memory_bytes", G,
    "Resident memory of the upstream: sum of psutil memory_info().rss over its processes.",
    (), "bytes",
)
PROCESS_GPU_MEMORY = MetricSpec(
    "inferwatch_upstream_process_gpu_memory_bytes", G,
    "GPU memory of the upstream: sum over GPUs of NVML usedGpuMemory for the pids of its processes "
    "(absent without NVML).",
    (), "bytes",
)
PROCESS_RESTARTS = MetricSpec(
    "inferwatch_upstream_process_restarts", C,
    "Restarts of the upstream observed by the sidecar, by reason: pid_change (the watched pid was "
    "replaced by another) or readiness (readiness lost and regained). Each reason is evidence of its own: one "
    "restart seen both ways counts once under each, so compare reasons rather than summing them.",
    ("reason",), "restarts",
)
PROCESS_OOM_EVENTS = MetricSpec(
    "inferwatch_upstream_process_oom_events", C,
    "Out-of-memory events of the upstream, by source: response_body (an upstream error whose body "
    "reports an out-of-memory error) or exit_status (a watched process ended with status 137 / SIGKILL).",
    ("source",), "events",
)

COLD_START_BUCKETS = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1200.0,
                      1800.0, 3600.0)
UPSTREAM_COLD_START = MetricSpec(
    "inferwatch_upstream_cold_start_seconds", MetricType.HISTOGRAM,
    "Cold starts of the upstream seen by the sidecar: from readiness lost (or, at the sidecar's start, the "
    "first probe that found it not ready) to the first successful token after readiness returned.",
    (), "seconds", COLD_START_BUCKETS,
)

SPECS: tuple[MetricSpec, ...] = (
    PROCESS_UP, PROCESS_COUNT, PROCESS_RESIDENT_MEMORY, PROCESS_GPU_MEMORY, PROCESS_RESTARTS,
    PROCESS_OOM_EVENTS, UPSTREAM_COLD_START,
)
