"""vLLM engine and KV cache: scheduler state, preemption, KV pressure, prefix cache, batch shape.

Every one of the 39 families a vLLM 0.32 server exports by default appears on this board, next to
the sidecar's normalised view (DP engines summed, KV blocks and fragmentation derived).
"""

from __future__ import annotations

from grafanalib import core

from alert_rules.config import RulesConfig
from dashboards import queries as q
from dashboards.board import dashboard
from dashboards.config import DashboardConfig
from dashboards.panels import Row, Spec, heatmap, stat, table, timeseries
from exporters.catalog.request import ENGINE_STATS_PLUGIN_UP as PLUGIN_UP

TITLE = "vLLM engine and KV cache"


def items(config: DashboardConfig, rules: RulesConfig) -> list[Spec | Row]:
    """The board's rows and panels, in order."""
    kv_levels = [("green", None), ("red", rules.kv_cache_ratio)]
    return [
        Row("Scheduler"),
        timeseries("Requests by state", "Requests inside the engine: running, waiting and (vLLM V0 only) swapped, "
                   "summed over data-parallel engines and replicas. The dashed line is the queue alert's threshold, "
                   "which applies to each replica on its own.",
                   "short", q.engine_requests(), thresholds=[("green", None), ("red", rules.queue_waiting)],
                   lines=True),
        timeseries("Running and waiting per engine", "vLLM's own running and waiting gauges, per engine of each "
                   "replica.", "short", q.vllm_running_waiting()),
        timeseries("Queue depth by reason", "Waiting requests by reason: capacity (no room in the batch or KV "
                   "cache) or deferred (LoRA budget, KV transfer): the sidecar's sum over engines and replicas, and "
                   "vLLM's own gauge.", "short", q.waiting_by_reason()),
        timeseries("Queue time", "p50, p90, p99 of the time requests waited before first being scheduled.", "s",
                   q.queue_time()),
        timeseries("Admission rejections", "Requests per second vLLM itself rejected with 503 at its queue limits "
                   "(--max-num-queued-reqs, --max-num-queued-tokens), by limit, next to the sidecar's overloaded "
                   "answers. The availability SLO counts each rejection once: more rejections than overloaded "
                   "answers means clients reach vLLM around the sidecar.", "reqps", q.admission_rejections()),
        timeseries("Finished requests by reason", "Requests per second finished by vLLM, by finished_reason.",
                   "reqps", q.engine_finished()),
        Row("Preemption"),
        timeseries("Preemptions per second", "Running requests preempted (KV cache full): the sidecar's sum over "
                   "engines and replicas, and vLLM's counter per engine of each replica.", "ops", q.preemptions(),
                   width=12),
        timeseries("Preemptions per request", "p90 and p99 of how often a finished request was preempted.", "short",
                   q.preemptions_per_request(), width=12),
        Row("KV cache"),
        timeseries("KV cache usage", "Share of GPU KV-cache blocks in use: the sidecar's block-weighted view of "
                   "the fullest replica (the KV alert fires per replica) and vLLM's gauge per engine of each "
                   "replica; the dashed line is the KV alert's threshold.", "percentunit",
                   q.kv_usage(), thresholds=kv_levels, lines=True, min_value=0, max_value=1),
        timeseries("KV blocks used, total, in flight (estimate without the plugin)", "KV-cache blocks in use "
                   "against blocks allocated, and the blocks held by the requests vLLM runs: vLLM's own count "
                   f"after its latest step while its stat-logger plugin is heard ({PLUGIN_UP.name} 1), else the "
                   "sidecar's estimate from its live token counts, which lags vLLM by whole requests between an "
                   "admission or a preemption and the next scrape.", "short", q.kv_blocks()),
        timeseries("KV block fragmentation (estimate)", "Estimated internal fragmentation of the blocks held by "
                   "the running requests: 1 - tokens / (blocks x block size), the worst replica; the tokens are "
                   "the sidecar's live counts, the blocks vLLM's own while its stat-logger plugin is heard, else "
                   "estimated. Absent with nothing in flight.", "percentunit", q.kv_fragmentation(),
                   min_value=0, max_value=1),
        timeseries("KV capacity and tokens in flight", "Tokens the KV caches can hold and tokens held by requests in "
                   "flight (summed over replicas), and tokens per block.", "short", q.kv_tokens()),
        timeseries("KV offload traffic (V1 swap)", "Bytes per second of KV cache moved between the GPU and the "
                   "CPU offload space (vLLM's OffloadingConnector), by direction, and both together per replica; "
                   "the dashed line is the offload alert's limit. Absent without offloading.", "Bps",
                   q.kv_offload_traffic(), thresholds=[("green", None), ("orange", rules.kv_offload_bytes_per_s)],
                   lines=True),
        timeseries("KV offload time, CPU space and failures", "Seconds per second spent storing and loading, share "
                   "of the CPU offload space in use (V0: the swap space) and store allocations that failed per "
                   "second.", "short", q.kv_offload_state()),
        table("Cache configuration", "vLLM's cache_config_info per engine of each replica: block size, GPU "
              "blocks, KV tokens.", "none", q.cache_config()),
        Row("Prefix cache"),
        timeseries("Prefix-cache hit ratio", "Share of looked-up prompt tokens found in the prefix cache: local over "
                   "the rate window (hits over queries, summed over replicas), local since start (mean over "
                   "replicas), and through a KV connector.", "percentunit",
                   q.prefix_cache_hit_ratio(), min_value=0, max_value=1),
        timeseries("Cached prompt tokens", "Prompt tokens per second skipped in prefill by cache tier, and prompt "
                   "tokens by where their KV came from.", "short", q.cached_prompt_tokens()),
        timeseries("Multimodal cache", "Multimodal cache queries and hits per second (items).", "ops",
                   q.multimodal_cache()),
        Row("Prefill and decode"),
        timeseries("Prefill against decode time", "Seconds of request time per second spent in prefill and in "
                   "decode (summed over engines).", "s", q.prefill_decode_time(), stacked=True),
        timeseries("Prefill and decode share", "Share of request time in prefill and in decode since the engine "
                   "started, the mean over replicas.", "percentunit", q.prefill_decode_share(), min_value=0,
                   max_value=1),
        timeseries("Request phases", "p90 of each request phase as vLLM measures it: prefill, decode and "
                   "inference (scheduled to last token).", "s", q.phase_latency()),
        timeseries("Engine-side latency", "vLLM's own p90 TTFT, inter-token latency, time per output token and "
                   "end-to-end latency.", "s", q.engine_latency()),
        timeseries("Engine tokens per second", "Prompt and generated tokens per second as the engine counts "
                   "them.", "short", q.engine_tokens()),
        timeseries("Estimated FLOPs and bytes", "vLLM's estimated FLOPs and bytes read and written per GPU per "
                   "second (non-zero with --enable-mfu-metrics).", "short", q.mfu()),
        Row("Per request, from vLLM's stat-logger plugin"),
        timeseries("Engine phases by prompt length", "p90 of the time requests spent queued, in prefill and in "
                   "decode inside vLLM, by prompt length bucket: vLLM's own per-request numbers, joined to each "
                   "trace id by the sidecar (serve.engine_stats_listen). Absent without the plugin.", "s",
                   q.engine_phases_by_length(), width=12),
        timeseries("Preemptions and cached prompt per request", "Mean preemptions per finished request and mean "
                   "share of its prompt served from the prefix cache, by outcome. Absent without the plugin.",
                   "short", q.engine_request_effects(), width=6),
        timeseries("Requests joined to vLLM's numbers", "Requests per second whose engine numbers arrived (joined) "
                   "or did not arrive within serve.engine_stats_wait_ms (missed).", "reqps", q.engine_stats_joins(),
                   width=6),
        Row("Batch shape"),
        heatmap("Tokens per engine step", "Batch size in tokens: computed prompt plus generated tokens per engine "
                "step (vLLM's iteration histogram).", "short", q.step_tokens_heatmap()),
        heatmap("Running requests per scrape", "Batch size in requests: running requests sampled at each scrape of "
                "the upstream.", "short", q.batch_requests_heatmap()),
        timeseries("Tokens per step", "p50 and p90 tokens per engine step, summed over engines.", "short",
                   q.step_tokens()),
        timeseries("Request sizes", "p90 of per-request sizes: prompt, generated, most generated of n, the "
                   "max_tokens asked for and prompt tokens actually computed in prefill.", "short",
                   q.request_shape()),
        timeseries("Sequences per request", "p90 of the n parameter per finished request.", "short", q.request_n()),
        Row("Cold starts and readiness"),
        timeseries("Readiness", "Per replica: 1 when the sidecar's readiness probe of vLLM succeeded, when the "
                   "engine is awake and when Prometheus scraped vLLM (no scrape in front of Ollama, which has no "
                   "/metrics).", "short", q.readiness(config.vllm_job),
                   min_value=0, max_value=1),
        stat("Engine restarts", "Cold starts in the time range: resets of vLLM's finished-request counter, "
             "summed over replicas.",
             "short", q.cold_starts(), width=4, thresholds=[("green", None), ("orange", 1.0)]),
        timeseries("Upstream process memory", "Resident and GPU memory of each replica's vLLM process.", "bytes",
                   q.process_memory(), width=8),
        table("Engine generation", "The vLLM metrics generation detected and the number of data-parallel engines.",
              "none", q.engine_info(), width=4),
    ]


def build(config: DashboardConfig, rules: RulesConfig, _length_edges: tuple[int, ...]) -> core.Dashboard:
    """The engine and KV cache board."""
    return dashboard(config, "engine", TITLE, "vLLM scheduler, preemption, KV cache, prefix cache, prefill and "
                     "decode, batch shape and readiness, from vLLM's /metrics and the sidecar.", items(config, rules))
