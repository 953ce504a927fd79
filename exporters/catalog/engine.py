"""Engine signals the sidecar derives from the upstream's ``/metrics`` and its own in-flight table.

The same names mean the same on every vLLM generation (V0, V1 ≤ 0.11, 0.3x): the parser maps each
generation's families onto one view and data-parallel engines are summed where a sum is meaningful.
Every help text states the formula. "vLLM family" below means the family of
``exporters.catalog.vllm`` with that name (or its alias in older generations).

Two kinds of series live here. The engine series (``inferwatch_engine_*``, ``inferwatch_kv_*``, and
``inferwatch_gpu_tokens_per_joule`` of ``gpu.py``) are derived from the upstream's ``/metrics``:
while it cannot be scraped they leave the exposition (``SCRAPE_STALE``). The scrape-health series
(``inferwatch_upstream_scrape_*``) are the sidecar's own and are always exported.
"""

from __future__ import annotations

from exporters import buckets
from exporters.catalog.spec import MetricSpec, MetricType

M = ("model_name",)
G, C, H = MetricType.GAUGE, MetricType.COUNTER, MetricType.HISTOGRAM

ENGINE_INFO = MetricSpec(
    "inferwatch_engine_info", G,
    "Value 1; generation = the vLLM metrics generation detected from the families present "
    "(v0: num_requests_swapped or gpu_cache_usage_perc; v1: kv_cache_usage_perc without an engine "
    "label; v1_engine: with one), or the engine for the others (sglang, llamacpp); engines = number of "
    "data-parallel engines seen.",
    ("model_name", "generation", "engines"),
)
ENGINE_REQUESTS = MetricSpec(
    "inferwatch_engine_requests", G,
    "Requests inside the engine by state: running = sum over engines of vllm:num_requests_running; "
    "waiting = sum of vllm:num_requests_waiting; swapped = sum of vllm:num_requests_swapped (V0 only; "
    "absent on V1, which preempts by recomputation and never swaps).",
    ("model_name", "state"), "requests",
)
ENGINE_PREEMPTIONS = MetricSpec(
    "inferwatch_engine_preemptions", C,
    "Preemptions of running requests: sum over engines of vLLM's vllm:num_preemptions_total "
    "(V0: swap-out or recompute; V1: recompute). Pair with inferwatch_engine_requests{state=\"swapped\"}.",
    M, "preemptions",
)
ENGINE_PREFILL_SECONDS = MetricSpec(
    "inferwatch_engine_prefill_seconds", C,
    "Seconds finished requests spent in prefill: sum over engines of vllm:request_prefill_time_seconds_sum.",
    M, "seconds",
)
ENGINE_DECODE_SECONDS = MetricSpec(
    "inferwatch_engine_decode_seconds", C,
    "Seconds finished requests spent in decode: sum over engines of vllm:request_decode_time_seconds_sum.",
    M, "seconds",
)
ENGINE_PREFILL_SHARE = MetricSpec(
    "inferwatch_engine_prefill_share_ratio", G,
    "Share of request time in prefill since the engine started: prefill_seconds / (prefill_seconds + "
    "decode_seconds), from vLLM's prefill and decode time histograms; absent before any request finished.",
    M, "ratio",
)
ENGINE_DECODE_SHARE = MetricSpec(
    "inferwatch_engine_decode_share_ratio", G,
    "Share of request time in decode since the engine started: decode_seconds / (prefill_seconds + "
    "decode_seconds) = 1 - prefill share; absent before any request finished.",
    M, "ratio",
)
ENGINE_PREFIX_CACHE_HIT_RATIO = MetricSpec(
    "inferwatch_engine_prefix_cache_hit_ratio", G,
    "Prefix-cache hit ratio since the engine started: sum(vllm:prefix_cache_hits_total) / "
    "sum(vllm:prefix_cache_queries_total) over engines (tokens); V0: vllm:gpu_prefix_cache_hit_rate. "
    "Absent before the first query.",
    M, "ratio",
)
ENGINE_STEP_TOKENS = MetricSpec(
    "inferwatch_engine_step_tokens", H,
    "Batch size in tokens: tokens per engine step (computed prompt plus generated), vLLM's "
    "vllm:iteration_tokens_total histogram summed over engines, bucket for bucket.",
    M, "tokens", buckets.ITERATION_TOKENS,
)
ENGINE_BATCH_REQUESTS = MetricSpec(
    "inferwatch_engine_batch_requests", H,
    "Batch size in requests: with the stat-logger plugin heard (serve.engine_stats_listen) and one model "
    "served, every scheduler state it sent (each change of the running count, and every 0.1 s while vLLM "
    "steps); else one observation of sum(vllm:num_requests_running) per successful scrape.",
    M, "requests", (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
ENGINE_GENERATION_TOKENS = MetricSpec(
    "inferwatch_engine_generation_tokens", C,
    "Output tokens generated: sum over engines of vllm:generation_tokens_total (the numerator of tokens "
    "per joule).",
    M, "tokens",
)

ENGINE_WAITING_BY_REASON = MetricSpec(
    "inferwatch_engine_waiting_requests", G,
    "Waiting requests by reason: sum over engines of vllm:num_requests_waiting_by_reason (0.32+; capacity = "
    "no room in the batch or KV cache, deferred = held back by a transient constraint such as the LoRA budget "
    "or a KV transfer). The reasons add up to inferwatch_engine_requests{state=\"waiting\"}.",
    ("model_name", "reason"), "requests",
)
ENGINE_ADMISSION_REJECTIONS = MetricSpec(
    "inferwatch_engine_admission_rejections", C,
    "Requests vLLM itself refused with 503 because a queue limit was reached (--max-num-queued-reqs, "
    "--max-num-queued-tokens): vllm:admission_rejections_total (0.32+), by reason. Those that came through the "
    "sidecar are also in inferwatch_requests_total{outcome=\"overloaded\"}; the SLO counts each once.",
    ("model_name", "reason"), "requests",
)

KV_USAGE = MetricSpec(
    "inferwatch_kv_cache_usage_ratio", G,
    "Fraction of GPU KV-cache blocks in use: vllm:kv_cache_usage_perc (V0: vllm:gpu_cache_usage_perc), "
    "averaged over engines weighted by each engine's usable blocks (plain mean when block counts are "
    "unknown).",
    M, "ratio",
)
KV_BLOCKS_TOTAL = MetricSpec(
    "inferwatch_kv_cache_blocks", G,
    "KV-cache blocks allocated on the GPU: sum over engines of the num_gpu_blocks label of "
    "vllm:cache_config_info (the --num-gpu-blocks-override when given).",
    M, "blocks",
)
KV_BLOCKS_USED = MetricSpec(
    "inferwatch_kv_cache_blocks_used", G,
    "KV-cache blocks in use: sum over engines of usage x usable blocks, where usage is "
    "vllm:kv_cache_usage_perc and usable = num_gpu_blocks - 1 on V1 (vLLM holds one null block back and "
    "computes usage as 1 - free / (num_gpu_blocks - 1)); V0: gpu_cache_usage_perc x num_gpu_blocks.",
    M, "blocks",
)
KV_BLOCK_SIZE = MetricSpec(
    "inferwatch_kv_cache_block_size_tokens", G,
    "Tokens per KV-cache block: the block_size label of vllm:cache_config_info.",
    M, "tokens",
)
KV_CAPACITY_TOKENS = MetricSpec(
    "inferwatch_kv_cache_capacity_tokens", G,
    "Tokens the GPU KV cache can hold: sum over engines of num_gpu_blocks x block_size.",
    M, "tokens",
)
KV_INFLIGHT_TOKENS = MetricSpec(
    "inferwatch_kv_cache_inflight_tokens", G,
    "Tokens held by the requests in flight through the sidecar that vLLM is running (picked as for "
    "inferwatch_kv_cache_inflight_blocks): each one's prompt plus generated tokens so far, as the sidecar "
    "counts them (serve.live_token_counts: the prompt estimated from its characters and one token per streamed "
    "chunk, or vLLM's exact counts with serve.exact_live_token_counts).",
    M, "tokens",
)
KV_INFLIGHT_BLOCKS = MetricSpec(
    "inferwatch_kv_cache_inflight_blocks", G,
    "KV-cache blocks held by the requests vLLM is running. While vLLM's stat-logger plugin is heard "
    "(inferwatch_engine_stats_plugin_up 1; one model, one engine): vLLM's own count after its latest step, "
    "its KV usage x its usable blocks. Otherwise an estimate: sum(ceil(tokens / block_size)) over "
    "vllm:num_requests_running of the requests in flight, the streams receiving tokens (one in the last 2 s) "
    "first, then the oldest (vLLM schedules first come, first served; requests still queued, or preempted "
    "back into the queue, hold no block); while the latest scrape of vLLM failed, the streams receiving "
    "tokens, then the oldest others while their blocks fit in vLLM's usable blocks.",
    M, "blocks",
)
KV_FRAGMENTATION = MetricSpec(
    "inferwatch_kv_cache_fragmentation_ratio", G,
    "Estimated internal fragmentation of the KV blocks held by the running requests: "
    "1 - inferwatch_kv_cache_inflight_tokens / (inferwatch_kv_cache_inflight_blocks x block_size), at least 0: "
    "against vLLM's own blocks in use while the stat-logger plugin is heard, else against the estimated "
    "blocks, sum(ceil(tokens / block_size)). An estimate either way: the tokens are the sidecar's live counts, "
    "and blocks shared through the prefix cache and requests that bypass the sidecar are not seen. Absent with "
    "no running request in flight through the sidecar.",
    M, "ratio",
)

# KV swap: V0 swapped whole requests to CPU memory; V1 offloads KV blocks through the OffloadingConnector
# (vllm:kv_offload_*). Both land in one family, by direction: store = GPU to CPU, load = CPU to GPU.
KV_SWAP_BYTES = MetricSpec(
    "inferwatch_kv_swap_bytes", C,
    "Bytes of KV cache moved between the GPU and the CPU offload space, by direction (store: GPU to CPU, "
    "load: CPU to GPU): sum over engines of vllm:kv_offload_store_bytes_total / vllm:kv_offload_load_bytes_total "
    "(V1 with the OffloadingConnector; the deprecated vllm:kv_offload_total_bytes_total by transfer_type when "
    "only it is present). Absent without offloading.",
    ("model_name", "direction"), "bytes",
)
KV_SWAP_SECONDS = MetricSpec(
    "inferwatch_kv_swap_seconds", C,
    "Seconds spent moving KV cache between the GPU and the CPU offload space, by direction: sum over engines "
    "of vllm:kv_offload_store_time_total / vllm:kv_offload_load_time_total. Absent without offloading.",
    ("model_name", "direction"), "seconds",
)
KV_SWAP_CPU_USAGE = MetricSpec(
    "inferwatch_kv_swap_cpu_usage_ratio", G,
    "Fraction (0-1) of the CPU KV space in use, mean over engines: vllm:kv_offload_cpu_cache_usage_perc (V1 "
    "offloading) or vllm:cpu_cache_usage_perc (V0 swap space). Absent when vLLM has neither.",
    M, "ratio",
)
KV_SWAP_ALLOCATION_FAILURES = MetricSpec(
    "inferwatch_kv_swap_allocation_failures", C,
    "Stores to the CPU offload space that could not allocate room: sum over engines of "
    "vllm:kv_offload_allocation_failure_total. Absent without offloading.",
    M,
)

SCRAPE_UP = MetricSpec(
    "inferwatch_upstream_scrape_up", G,
    "1 when the last scrape of the upstream's /metrics returned 200 and parsed, else 0.", ("upstream",),
)
SCRAPE_DURATION = MetricSpec(
    "inferwatch_upstream_scrape_duration_seconds", G,
    "Seconds the last scrape of the upstream's /metrics took (fetch plus parse).", ("upstream",), "seconds",
)
SCRAPE_FAILURES = MetricSpec(
    "inferwatch_upstream_scrape_failures", C,
    "Scrapes of the upstream's /metrics that failed, by reason (timeout, connect, http_status, "
    "parse, error).",
    ("upstream", "reason"),
)
SCRAPE_PARSE_ERRORS = MetricSpec(
    "inferwatch_upstream_scrape_parse_errors", C,
    "Malformed lines or families skipped while parsing the upstream's /metrics (never fatal).",
    ("upstream",), "errors",
)
SCRAPE_UNKNOWN_FAMILIES = MetricSpec(
    "inferwatch_upstream_scrape_unknown_families", G,
    "vllm: families in the last scrape that the catalog does not know (skipped; a sign of a new "
    "vLLM version).",
    ("upstream",), "families",
)
SCRAPE_LAST_SUCCESS = MetricSpec(
    "inferwatch_upstream_scrape_last_success_timestamp_seconds", G,
    "Unix time of the last successful scrape of the upstream's /metrics.", ("upstream",), "seconds",
)

SCRAPE_CONSECUTIVE_FAILURES = MetricSpec(
    "inferwatch_upstream_scrape_consecutive_failures", G,
    "Scrapes of the upstream's /metrics that failed in a row since the last one that succeeded (0 after a "
    "success).", ("upstream",), "scrapes",
)
SCRAPE_STALE = MetricSpec(
    "inferwatch_upstream_scrape_stale", G,
    "1 while the engine series (inferwatch_engine_*, inferwatch_kv_*, inferwatch_gpu_tokens_per_joule) are "
    "left out of /metrics, so that Prometheus marks them stale instead of a stopped engine looking busy: "
    "after scrape.stale_after_failures failed scrapes in a row (see "
    "inferwatch_upstream_scrape_consecutive_failures and _failures by reason), or while the last readiness "
    "probe found the upstream not ready (inferwatch_upstream_ready 0, an answer or a refused connection, "
    "not a timeout); else 0.", ("upstream",),
)

ENGINE_SERIES: tuple[MetricSpec, ...] = (
    ENGINE_INFO, ENGINE_REQUESTS, ENGINE_PREEMPTIONS, ENGINE_PREFILL_SECONDS, ENGINE_DECODE_SECONDS,
    ENGINE_PREFILL_SHARE, ENGINE_DECODE_SHARE, ENGINE_PREFIX_CACHE_HIT_RATIO, ENGINE_STEP_TOKENS,
    ENGINE_BATCH_REQUESTS, ENGINE_GENERATION_TOKENS, ENGINE_WAITING_BY_REASON, ENGINE_ADMISSION_REJECTIONS,
    KV_SWAP_BYTES, KV_SWAP_SECONDS, KV_SWAP_CPU_USAGE, KV_SWAP_ALLOCATION_FAILURES, KV_USAGE, KV_BLOCKS_TOTAL,
    KV_BLOCKS_USED, KV_BLOCK_SIZE, KV_CAPACITY_TOKENS, KV_INFLIGHT_TOKENS, KV_INFLIGHT_BLOCKS, KV_FRAGMENTATION,
)
"""Derived from the upstream's /metrics: left out of the exposition while SCRAPE_STALE reads 1 (with
gpu.GPU_TOKENS_PER_JOULE)."""
SCRAPE_HEALTH: tuple[MetricSpec, ...] = (
    SCRAPE_UP, SCRAPE_DURATION, SCRAPE_FAILURES, SCRAPE_PARSE_ERRORS, SCRAPE_UNKNOWN_FAMILIES,
    SCRAPE_LAST_SUCCESS, SCRAPE_CONSECUTIVE_FAILURES, SCRAPE_STALE,
)
"""The sidecar's own view of its scrapes: always exported."""

SPECS: tuple[MetricSpec, ...] = (*ENGINE_SERIES, *SCRAPE_HEALTH)
