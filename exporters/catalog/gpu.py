"""The NVML GPU exporter's families (names and units per shared/reference/gpu.md §4, ``inferwatch_`` prefix).

Every per-GPU series carries ``gpu`` (NVML index as a string) and ``uuid`` (``GPU-...``); static facts
sit on ``inferwatch_gpu_info``. The GPU model is the ``gpu_model`` label, never ``model_name`` (that is
the served LLM on vLLM's series). A reading a GPU does not support is omitted, never a sentinel.
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

GPU = ("gpu", "uuid")
G, C = MetricType.GAUGE, MetricType.COUNTER

GPU_INFO = MetricSpec(
    "inferwatch_gpu_info", G,
    "Value 1; static facts of a GPU: gpu_model (NVML name), pci_bus_id, driver_version, "
    "cuda_driver_version, memory_total_bytes.",
    (*GPU, "gpu_model", "pci_bus_id", "driver_version", "cuda_driver_version", "memory_total_bytes"),
)
GPU_COUNT = MetricSpec("inferwatch_gpu_count", G, "GPUs NVML reports (nvmlDeviceGetCount).", (), "gpus")
GPU_UP = MetricSpec(
    "inferwatch_gpu_up", G,
    "1 while the GPU answers NVML; 0 once it is lost (fallen off the bus) or failed persistently.", GPU,
)
GPU_MEMORY_USED = MetricSpec(
    "inferwatch_gpu_memory_used_bytes", G, "Framebuffer memory used: nvmlDeviceGetMemoryInfo (v2 when "
    "supported, else v1) .used.", GPU, "bytes",
)
GPU_MEMORY_TOTAL = MetricSpec(
    "inferwatch_gpu_memory_total_bytes", G, "Framebuffer memory total: nvmlDeviceGetMemoryInfo .total.",
    GPU, "bytes",
)
GPU_MEMORY_FREE = MetricSpec(
    "inferwatch_gpu_memory_free_bytes", G, "Framebuffer memory free: nvmlDeviceGetMemoryInfo .free.",
    GPU, "bytes",
)
GPU_MEMORY_RESERVED = MetricSpec(
    "inferwatch_gpu_memory_reserved_bytes", G,
    "Framebuffer memory reserved by the driver and firmware: nvmlDeviceGetMemoryInfo v2 .reserved "
    "(absent where only v1 is supported).",
    GPU, "bytes",
)
GPU_UTILIZATION = MetricSpec(
    "inferwatch_gpu_utilization_ratio", G,
    "Share of the last sample period a kernel ran: nvmlDeviceGetUtilizationRates .gpu / 100.", GPU, "ratio",
)
GPU_MEMORY_COPY_UTILIZATION = MetricSpec(
    "inferwatch_gpu_memory_copy_utilization_ratio", G,
    "Share of the last sample period memory was read or written: UtilizationRates .memory / 100 "
    "(not memory used; see inferwatch_gpu_memory_used_bytes).",
    GPU, "ratio",
)
GPU_POWER = MetricSpec(
    "inferwatch_gpu_power_usage_watts", G, "Power draw: nvmlDeviceGetPowerUsage / 1000.", GPU, "watts",
)
GPU_POWER_LIMIT = MetricSpec(
    "inferwatch_gpu_power_limit_watts", G, "Enforced power limit: nvmlDeviceGetEnforcedPowerLimit / 1000.",
    GPU, "watts",
)
GPU_ENERGY = MetricSpec(
    "inferwatch_gpu_energy_joules", C,
    "Energy consumed since the driver loaded: nvmlDeviceGetTotalEnergyConsumption / 1000 (mJ to J).",
    GPU, "joules",
)
GPU_TEMPERATURE = MetricSpec(
    "inferwatch_gpu_temperature_celsius", G, "GPU die temperature: nvmlDeviceGetTemperature(GPU sensor).",
    GPU, "celsius",
)
GPU_SM_CLOCK = MetricSpec(
    "inferwatch_gpu_sm_clock_hertz", G, "SM clock: nvmlDeviceGetClockInfo(SM) x 1e6.", GPU, "hertz",
)
GPU_MEMORY_CLOCK = MetricSpec(
    "inferwatch_gpu_memory_clock_hertz", G, "Memory clock: nvmlDeviceGetClockInfo(MEM) x 1e6.", GPU, "hertz",
)
GPU_CLOCK_EVENT_ACTIVE = MetricSpec(
    "inferwatch_gpu_clock_event_active", G,
    "1 while a clock-throttle reason is active, else 0, one series per reason (gpu_idle, "
    "applications_clocks, sw_power_cap, hw_slowdown, sync_boost, sw_thermal, hw_thermal, "
    "hw_power_brake, display_clocks): bits of nvmlDeviceGetCurrentClocksEventReasons.",
    (*GPU, "reason"),
)
GPU_XID_ERRORS = MetricSpec(
    "inferwatch_gpu_xid_errors", C,
    "XID errors by code, counted by the exporter's NVML event thread (nvmlEventSetWait, "
    "nvmlEventTypeXidCriticalError) since the exporter started.",
    (*GPU, "xid"), "errors",
)
GPU_XID_LAST = MetricSpec(
    "inferwatch_gpu_xid_last_timestamp_seconds", G,
    "Unix time the exporter last received this XID code from this GPU.", (*GPU, "xid"), "seconds",
)
GPU_ECC_ERRORS = MetricSpec(
    "inferwatch_gpu_ecc_errors", C,
    "ECC errors since the driver loaded: nvmlDeviceGetTotalEccErrors(error_type, VOLATILE); "
    "error_type = corrected or uncorrected; absent where ECC is unsupported.",
    (*GPU, "error_type"), "errors",
)
GPU_REMAPPED_ROWS = MetricSpec(
    "inferwatch_gpu_remapped_rows", G,
    "Rows remapped in GPU memory: nvmlDeviceGetRemappedRows, error_type = correctable or uncorrectable "
    "(Ampere and newer).",
    (*GPU, "error_type"), "rows",
)
GPU_ROW_REMAP_PENDING = MetricSpec(
    "inferwatch_gpu_row_remap_pending", G,
    "1 when a row remap is pending a GPU reset: nvmlDeviceGetRemappedRows .isPending.", GPU,
)
GPU_PROCESSES = MetricSpec(
    "inferwatch_gpu_processes", G, "Compute processes on the GPU: len(nvmlDeviceGetComputeRunningProcesses).",
    GPU, "processes",
)
GPU_PROCESS_MEMORY = MetricSpec(
    "inferwatch_gpu_process_memory_used_bytes", G,
    "GPU memory used by one process: nvmlDeviceGetComputeRunningProcesses .usedGpuMemory, by pid "
    "(absent when the driver does not report it).",
    (*GPU, "pid"), "bytes",
)
GPU_TOKENS_PER_JOULE = MetricSpec(
    "inferwatch_gpu_tokens_per_joule", G,
    "Energy efficiency of the upstream over the window between the last two successful scrapes: the "
    "increase of inferwatch_engine_generation_tokens_total divided by the joules the GPUs that serve it "
    "(gpu.serving_gpus; all by default) used meanwhile, from nvmlDeviceGetTotalEnergyConsumption "
    "(mJ / 1000) read with each scrape. Absent, never 0, when a serving GPU has no energy counter "
    "(NVMLError_NotSupported, before Volta) or is lost, when a counter went backwards (driver reload: "
    "that window is skipped), or when no energy was used.",
    ("model_name",), "tokens_per_joule",
)
GPU_EXPORTER_UP = MetricSpec(
    "inferwatch_gpu_exporter_up", G,
    "1 when NVML initialised and the GPU exporter runs; 0 when NVML is unavailable (no driver).", (),
)
GPU_EXPORTER_UNSUPPORTED = MetricSpec(
    "inferwatch_gpu_exporter_unsupported_calls", C,
    "NVML calls skipped because this GPU does not support them (NVMLError_NotSupported, "
    "NVMLError_FunctionNotFound, NVMLError_NoPermission), by function.",
    (*GPU, "call"), "calls",
)
GPU_EXPORTER_ERRORS = MetricSpec(
    "inferwatch_gpu_exporter_errors", C,
    "NVML calls that failed for another reason (GPU lost, unknown error, timeout), by function and error "
    "class.",
    (*GPU, "call", "error"), "errors",
)
GPU_EXPORTER_COLLECT_DURATION = MetricSpec(
    "inferwatch_gpu_exporter_collect_duration_seconds", G,
    "Seconds the last NVML collection of every GPU took.", (), "seconds",
)

SPECS: tuple[MetricSpec, ...] = (
    GPU_INFO, GPU_COUNT, GPU_UP, GPU_MEMORY_USED, GPU_MEMORY_TOTAL, GPU_MEMORY_FREE, GPU_MEMORY_RESERVED,
    GPU_UTILIZATION, GPU_MEMORY_COPY_UTILIZATION, GPU_POWER, GPU_POWER_LIMIT, GPU_ENERGY,
    GPU_TEMPERATURE, GPU_SM_CLOCK, GPU_MEMORY_CLOCK, GPU_CLOCK_EVENT_ACTIVE, GPU_XID_ERRORS,
    GPU_XID_LAST, GPU_ECC_ERRORS, GPU_REMAPPED_ROWS, GPU_ROW_REMAP_PENDING, GPU_PROCESSES,
    GPU_PROCESS_MEMORY, GPU_TOKENS_PER_JOULE, GPU_EXPORTER_UP, GPU_EXPORTER_UNSUPPORTED,
    GPU_EXPORTER_ERRORS, GPU_EXPORTER_COLLECT_DURATION,
)
