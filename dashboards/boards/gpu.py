"""GPUs: memory, utilisation, power and energy, tokens per joule, heat, clocks, throttling, errors."""

from __future__ import annotations

from grafanalib import core

from alert_rules.config import RulesConfig
from dashboards import queries as q
from dashboards.board import dashboard
from dashboards.config import DashboardConfig
from dashboards.panels import Row, Spec, stat, table, timeseries

TITLE = "GPUs"


def items(rules: RulesConfig) -> list[Spec | Row]:
    """The board's rows and panels, in order."""
    return [
        Row("Memory"),
        timeseries("GPU memory used and total", "Framebuffer memory used against the total per GPU; the alert line "
                   f"is {rules.gpu_memory_ratio * 100:g} % of the total (rules.gpu_memory_ratio).", "bytes",
                   q.gpu_memory(rules)),
        timeseries("GPU memory used share", "Memory used as a share of the total; the dashed line is the GPU memory "
                   "alert's threshold.", "percentunit", q.gpu_memory_ratio(),
                   thresholds=[("green", None), ("red", rules.gpu_memory_ratio)], lines=True, min_value=0,
                   max_value=1),
        timeseries("Memory per process", "GPU memory used by each compute process, and the process count.", "bytes",
                   q.gpu_process_memory()),
        timeseries("Free and reserved memory", "Free memory and memory reserved by the driver and firmware.",
                   "bytes", q.gpu_memory_breakdown(), width=12),
        timeseries("Utilization", "Share of time a kernel ran, and a memory copy ran, per GPU.", "percentunit",
                   q.gpu_utilization(), width=12, min_value=0, max_value=1),
        Row("Power and efficiency"),
        timeseries("Power", "Power draw against the enforced limit, and the average from the energy counter.",
                   "watt", q.gpu_power()),
        stat("Energy in range", "Energy each GPU used over the selected time range.", "joule", q.gpu_energy(),
             width=8),
        timeseries("Tokens per joule", "Generated tokens per joule of GPU energy, per model (the mean over "
                   "replicas).", "short",
                   q.tokens_per_joule()),
        Row("Heat, clocks and throttling"),
        timeseries("Temperature", "GPU die temperature.", "celsius", q.gpu_temperature()),
        timeseries("Clocks", "SM and memory clocks.", "hertz", q.gpu_clocks()),
        timeseries("Throttle reasons", "1 while a clock-throttle reason is active, per GPU and reason.", "short",
                   q.throttle_reasons(), min_value=0, max_value=1),
        Row("Errors and health"),
        timeseries("XID errors", "XID errors per GPU in the rate window (0 for GPUs that never reported one).",
                   "short", q.xid_errors()),
        timeseries("ECC errors and row remapping", "ECC errors per second, remapped rows and pending remaps.",
                   "short", q.ecc_errors()),
        timeseries("GPUs up", "GPUs answering NVML and GPUs NVML reports, over all replicas, and whether "
                   "every replica's exporter runs.", "short",
                   q.gpu_up()),
        timeseries("Exporter health", "NVML calls per second skipped as unsupported and failed, and the seconds "
                   "the last collection took.", "short", q.gpu_exporter_health(), width=12),
        table("Last XID per GPU", "Unix time of the last XID error per GPU and code.", "dateTimeAsIso",
              q.xid_last(), width=12),
        table("GPU inventory", "Static facts of every GPU.", "none", q.gpu_info(), width=24),
    ]


def build(config: DashboardConfig, rules: RulesConfig, _length_edges: tuple[int, ...]) -> core.Dashboard:
    """The GPU board."""
    return dashboard(config, "gpu", TITLE, "GPU memory, utilisation, power, energy efficiency, temperature, clocks, "
                     "throttling and errors from the sidecar's NVML exporter.", items(rules))
