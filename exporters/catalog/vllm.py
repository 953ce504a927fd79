"""Families the vLLM server exposes on its own ``/metrics`` (read by the sidecar, never re-exported).

Names are the vLLM 0.32/0.33 (V1 engine, ``engine`` label) names. ``aliases`` gives the name an
older generation used where it differs: ``"v0"`` (0.6–0.9, the V0 engine, no ``engine`` label) and
``"v1"`` (V1 engine up to 0.11). A generation missing from ``aliases`` used the same name; a family
that did not exist in a generation simply is not found there (see ``GENERATIONS``).
Facts: shared/reference/vllm.md §2–3 and vllm-cpu-real-server.md §4.
"""

from __future__ import annotations

from exporters import buckets
from exporters.catalog.spec import MetricSpec, MetricType, Source

ENGINE_LABELS = ("model_name", "engine")

RAY_PREFIXES = ("ray_vllm:", "ray_vllm_")
"""Prefixes Ray Serve LLM puts in front of vLLM's names instead of ``vllm:``: Ray's metrics agent adds
``ray_``, and vLLM 0.33's Ray stat logger (``vllm/v1/metrics/ray_wrappers.py``) also turns ``:`` into
``_`` (``ray_vllm_num_requests_running``); earlier releases kept the colon (``ray_vllm:...``). Ray adds
a ``ReplicaId`` label (one vLLM per Serve replica)."""
RAY_REPLICA_LABEL = "ReplicaId"
VLLM_PREFIX = "vllm:"

GENERATIONS = ("v0", "v1", "v1_engine")
"""``v0``: V0 engine (0.6–0.9); ``v1``: V1 up to 0.11 (no engine label in most setups is not
guaranteed, names as 0.11); ``v1_engine``: current 0.3x with an ``engine`` label on every series."""


def _vllm(
    name: str,
    type_: MetricType,
    help_: str,
    labels: tuple[str, ...] = ENGINE_LABELS,
    *,
    unit: str = "",
    bounds: tuple[float, ...] | None = None,
    aliases: dict[str, str] | None = None,
) -> MetricSpec:
    return MetricSpec(name, type_, help_, labels, unit, bounds, Source.VLLM, dict(aliases or {}))


G, C, H = MetricType.GAUGE, MetricType.COUNTER, MetricType.HISTOGRAM

# --- gauges -----------------------------------------------------------------------------------
NUM_REQUESTS_RUNNING = _vllm(
    "vllm:num_requests_running", G, "Requests in the engine's running batch.", unit="requests"
)
NUM_REQUESTS_WAITING = _vllm(
    "vllm:num_requests_waiting", G,
    "Requests waiting to be scheduled (0.33: capacity plus deferred).", unit="requests",
)
NUM_REQUESTS_WAITING_BY_REASON = _vllm(
    "vllm:num_requests_waiting_by_reason", G, "Waiting requests split by reason (capacity, deferred).",
    (*ENGINE_LABELS, "reason"), unit="requests",
)
NUM_REQUESTS_SWAPPED = _vllm(
    "vllm:num_requests_swapped", G,
    "V0 only: requests swapped out to CPU memory (V1 preempts by recomputation, no swapping).",
    ("model_name",), unit="requests",
)
ENGINE_SLEEP_STATE = _vllm(
    "vllm:engine_sleep_state", G,
    "1/0 flags of the engine's sleep state (awake, weights_offloaded, discard_all).",
    (*ENGINE_LABELS, "sleep_state"),
)
KV_CACHE_USAGE_PERC = _vllm(
    "vllm:kv_cache_usage_perc", G,
    "Fraction (0-1) of GPU KV-cache blocks in use; evictable prefix-cached blocks count as free.",
    unit="ratio", aliases={"v0": "vllm:gpu_cache_usage_perc"},
)
CPU_CACHE_USAGE_PERC = _vllm(
    "vllm:cpu_cache_usage_perc", G, "V0 only: fraction (0-1) of CPU (swap) KV-cache blocks in use.",
    ("model_name",), unit="ratio",
)
CACHE_CONFIG_INFO = _vllm(
    "vllm:cache_config_info", G,
    "Value 1; labels are every CacheConfig attribute (block_size, num_gpu_blocks, ...) plus engine.",
    ("engine", "block_size", "num_gpu_blocks", "num_gpu_blocks_override", "kv_cache_size_tokens"),
)

# --- counters ---------------------------------------------------------------------------------
PREFIX_CACHE_QUERIES = _vllm(
    "vllm:prefix_cache_queries", C, "Prompt tokens looked up in the local prefix cache.", unit="tokens",
)
PREFIX_CACHE_HITS = _vllm(
    "vllm:prefix_cache_hits", C, "Prompt tokens found in the local prefix cache.", unit="tokens",
)
GPU_PREFIX_CACHE_HIT_RATE = _vllm(
    "vllm:gpu_prefix_cache_hit_rate", G, "V0 only: GPU prefix-cache hit rate (0-1), a gauge.",
    ("model_name",), unit="ratio",
)
CPU_PREFIX_CACHE_HIT_RATE = _vllm(
    "vllm:cpu_prefix_cache_hit_rate", G, "V0 only: CPU prefix-cache hit rate (0-1; -1 when unused), a gauge.",
    ("model_name",), unit="ratio",
)
LORA_REQUESTS_INFO = _vllm(
    "vllm:lora_requests_info", G,
    "Only with LoRA enabled: value = Unix time of the update; adapters listed comma-separated in labels.",
    ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
)
EXTERNAL_PREFIX_CACHE_QUERIES = _vllm(
    "vllm:external_prefix_cache_queries", C, "Prompt tokens queried through a KV connector's cache.",
    unit="tokens",
)
EXTERNAL_PREFIX_CACHE_HITS = _vllm(
    "vllm:external_prefix_cache_hits", C, "Prompt tokens found through a KV connector's cache.",
    unit="tokens",
)
MM_CACHE_QUERIES = _vllm("vllm:mm_cache_queries", C, "Multimodal cache queries (items).")
MM_CACHE_HITS = _vllm("vllm:mm_cache_hits", C, "Multimodal cache hits (items).")
NUM_PREEMPTIONS = _vllm(
    "vllm:num_preemptions", C, "Cumulative preemptions of running requests.", unit="preemptions",
)
PROMPT_TOKENS = _vllm(
    "vllm:prompt_tokens", C, "Prompt tokens of completed prefills, cached tokens included.", unit="tokens",
)
PROMPT_TOKENS_BY_SOURCE = _vllm(
    "vllm:prompt_tokens_by_source", C,
    "Prompt tokens by where their KV came from (local_compute, local_cache_hit, external_kv_transfer).",
    (*ENGINE_LABELS, "source"), unit="tokens",
)
PROMPT_TOKENS_CACHED = _vllm(
    "vllm:prompt_tokens_cached", C, "Prompt tokens skipped in prefill (local plus external cache).",
    unit="tokens",
)
PROMPT_TOKENS_CACHED_BY_SOURCE = _vllm(
    "vllm:prompt_tokens_cached_by_source", C, "Cached prompt tokens by cache tier.",
    (*ENGINE_LABELS, "source"), unit="tokens",
)
GENERATION_TOKENS = _vllm("vllm:generation_tokens", C, "Output tokens generated.", unit="tokens")
REQUEST_SUCCESS = _vllm(
    "vllm:request_success", C,
    "Finished requests by finished_reason (stop, length, abort, error, repetition).",
    (*ENGINE_LABELS, "finished_reason"), unit="requests",
)
ADMISSION_REJECTIONS = _vllm(
    "vllm:admission_rejections", C, "Requests rejected with 503 by the queue limits.",
    ("model_name", "reason"), unit="requests",
)
ESTIMATED_FLOPS_PER_GPU = _vllm(
    "vllm:estimated_flops_per_gpu_total", C, "Estimated FLOPs per GPU (moves with --enable-mfu-metrics).",
)
ESTIMATED_READ_BYTES_PER_GPU = _vllm(
    "vllm:estimated_read_bytes_per_gpu_total", C, "Estimated bytes read per GPU.", unit="bytes",
)
ESTIMATED_WRITE_BYTES_PER_GPU = _vllm(
    "vllm:estimated_write_bytes_per_gpu_total", C, "Estimated bytes written per GPU.", unit="bytes",
)

CORRUPTED_REQUESTS = _vllm(
    "vllm:corrupted_requests", C,
    "0.33, only with VLLM_COMPUTE_NANS_IN_LOGITS=1: finished requests that had NaNs in their logits.",
    unit="requests",
)
WATERMARK_REQUESTS = _vllm(
    "vllm:watermark_requests", C,
    "0.33, only with a watermark config: finished requests by status (watermarked, skipped, not_watermarked).",
    (*ENGINE_LABELS, "status"), unit="requests",
)
TOOL_CALL_PARSER_INVOCATIONS = _vllm(
    "vllm:tool_call_parser_invocations_total", C,
    "0.33, only with --tool-call-parser: tool-call parser runs by mode (streaming, non_streaming), outcome "
    "(tool_call, no_tool_call) and request_type (chat_completions, responses, other).",
    ("model_name", "mode", "outcome", "request_type"),
)
NUM_REQUESTS_KV_FETCH_BY_STAGE = _vllm(
    "vllm:num_requests_kv_fetch_by_stage", G,
    "0.33, only on a KV-transfer consumer: waiting requests by async KV-load stage (waiting_to_start, "
    "in_progress, completed_waiting).",
    (*ENGINE_LABELS, "stage"), unit="requests",
)

# --- KV offloading (OffloadingConnector, 0.33: vllm/distributed/kv_transfer/kv_connector/v1/offloading/
# metrics.py and vllm/v1/kv_offload/cpu/common.py); present only with the connector configured.
_TRANSFER_SIZE = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
KV_OFFLOAD_STORE_BYTES = _vllm(
    "vllm:kv_offload_store_bytes", C, "Bytes stored from the GPU KV cache to the offload medium (CPU).",
    unit="bytes",
)
KV_OFFLOAD_LOAD_BYTES = _vllm(
    "vllm:kv_offload_load_bytes", C, "Bytes loaded from the offload medium (CPU) back into the GPU KV cache.",
    unit="bytes",
)
KV_OFFLOAD_STORE_TIME = _vllm(
    "vllm:kv_offload_store_time", C, "Seconds spent storing KV blocks from the GPU to the offload medium.",
    unit="seconds",
)
KV_OFFLOAD_LOAD_TIME = _vllm(
    "vllm:kv_offload_load_time", C, "Seconds spent loading KV blocks from the offload medium to the GPU.",
    unit="seconds",
)
KV_OFFLOAD_STORE_SIZE = _vllm(
    "vllm:kv_offload_store_size", H, "Bytes per store operation.", unit="bytes", bounds=_TRANSFER_SIZE,
)
KV_OFFLOAD_LOAD_SIZE = _vllm(
    "vllm:kv_offload_load_size", H, "Bytes per load operation.", unit="bytes", bounds=_TRANSFER_SIZE,
)
KV_OFFLOAD_LOOKUP_SYNC_DELAY = _vllm(
    "vllm:kv_offload_lookup_sync_delay_seconds", H, "Seconds one offload lookup call took.", unit="seconds",
)
KV_OFFLOAD_LOOKUP_ASYNC_DELAY = _vllm(
    "vllm:kv_offload_lookup_async_delay_seconds", H,
    "Seconds from a request's first offload lookup until its asynchronous lookup resolved.", unit="seconds",
)
KV_OFFLOAD_ALLOCATION_FAILURE = _vllm(
    "vllm:kv_offload_allocation_failure", C, "Store allocations in the offload medium that failed.",
)
KV_OFFLOAD_CONFIG_INFO = _vllm(
    "vllm:kv_offload_config_info", G,
    "Value 1; static offload configuration (CPU spec: cpu_num_chunks, cpu_blocks_per_chunk, "
    "cpu_kv_cache_size_bytes, cpu_kv_cache_size_tokens).",
    ("engine", "cpu_num_chunks", "cpu_blocks_per_chunk", "cpu_kv_cache_size_bytes", "cpu_kv_cache_size_tokens"),
)
KV_OFFLOAD_CPU_CACHE_USAGE_PERC = _vllm(
    "vllm:kv_offload_cpu_cache_usage_perc", G, "Fraction (0-1) of the CPU offload space in use.", unit="ratio",
)
KV_OFFLOAD_CPU_CACHE_WRITE_USAGE_PERC = _vllm(
    "vllm:kv_offload_cpu_cache_write_usage_perc", G,
    "Fraction (0-1) of the CPU offload space pinned by stores in flight.", unit="ratio",
)
KV_OFFLOAD_CPU_CACHE_READ_USAGE_PERC = _vllm(
    "vllm:kv_offload_cpu_cache_read_usage_perc", G,
    "Fraction (0-1) of the CPU offload space pinned by loads in flight.", unit="ratio",
)
KV_OFFLOAD_CPU_ALLOCATION_SIZE = _vllm(
    "vllm:kv_offload_cpu_allocation_size", H, "Chunks allocated in the CPU offload space per store.",
)
KV_OFFLOAD_STORES_SKIPPED = _vllm(
    "vllm:kv_offload_stores_skipped", C, "Stores skipped by the CPU spec's store_threshold (when >= 2).",
)
KV_OFFLOAD_TOTAL_BYTES = _vllm(
    "vllm:kv_offload_total_bytes", C,
    "Deprecated, still emitted for the CPU spec: bytes moved by transfer_type (GPU_to_CPU = store, "
    "CPU_to_GPU = load).",
    (*ENGINE_LABELS, "transfer_type"), unit="bytes",
)
KV_OFFLOAD_TOTAL_TIME = _vllm(
    "vllm:kv_offload_total_time", C,
    "Deprecated, still emitted for the CPU spec: transfer seconds by transfer_type.",
    (*ENGINE_LABELS, "transfer_type"), unit="seconds",
)
KV_OFFLOAD_SIZE = _vllm(
    "vllm:kv_offload_size", H, "Deprecated, still emitted for the CPU spec: bytes per transfer by transfer_type.",
    (*ENGINE_LABELS, "transfer_type"), unit="bytes", bounds=_TRANSFER_SIZE,
)
KV_OFFLOAD_STORE_TRANSFER = "GPU_to_CPU"
KV_OFFLOAD_LOAD_TRANSFER = "CPU_to_GPU"
"""``transfer_type`` values of the deprecated offload families."""

# --- histograms -------------------------------------------------------------------------------
_TOK = buckets.REQUEST_TOKENS
REQUEST_PROMPT_TOKENS = _vllm(
    "vllm:request_prompt_tokens", H, "Prompt length per finished request.", unit="tokens", bounds=_TOK
)
REQUEST_GENERATION_TOKENS = _vllm(
    "vllm:request_generation_tokens", H, "Generated tokens per finished request.", unit="tokens", bounds=_TOK
)
REQUEST_MAX_NUM_GENERATION_TOKENS = _vllm(
    "vllm:request_max_num_generation_tokens", H,
    "Per user request, the most generated tokens among its n sequences.", unit="tokens", bounds=_TOK,
)
REQUEST_PARAMS_N = _vllm(
    "vllm:request_params_n", H, "The n parameter per finished request.", bounds=(1, 2, 5, 10, 20)
)
REQUEST_PARAMS_MAX_TOKENS = _vllm(
    "vllm:request_params_max_tokens", H, "The max_tokens parameter per finished request (when set).",
    unit="tokens", bounds=_TOK,
)
REQUEST_PREFILL_KV_COMPUTED_TOKENS = _vllm(
    "vllm:request_prefill_kv_computed_tokens", H, "Per finished request: prompt tokens minus cached tokens.",
    unit="tokens", bounds=_TOK,
)
ITERATION_TOKENS = _vllm(
    "vllm:iteration_tokens_total", H, "Tokens per engine step (computed prompt plus generated).",
    unit="tokens", bounds=buckets.ITERATION_TOKENS,
)
TIME_TO_FIRST_TOKEN = _vllm(
    "vllm:time_to_first_token_seconds", H, "Time to first token from the frontend's arrival time.",
    unit="seconds", bounds=buckets.TIME_TO_FIRST_TOKEN,
)
INTER_TOKEN_LATENCY = _vllm(
    "vllm:inter_token_latency_seconds", H, "Time between successive output batches of a request.",
    unit="seconds", bounds=buckets.INTER_TOKEN_LATENCY,
    aliases={"v0": "vllm:time_per_output_token_seconds"},
)
REQUEST_TIME_PER_OUTPUT_TOKEN = _vllm(
    "vllm:request_time_per_output_token_seconds", H, "Per-request mean time per output token.",
    unit="seconds", bounds=buckets.INTER_TOKEN_LATENCY,
)
E2E_REQUEST_LATENCY = _vllm(
    "vllm:e2e_request_latency_seconds", H, "Arrival to final token.", unit="seconds",
    bounds=buckets.REQUEST_LATENCY,
)
REQUEST_QUEUE_TIME = _vllm(
    "vllm:request_queue_time_seconds", H, "Time spent waiting before first scheduled.", unit="seconds",
    bounds=buckets.REQUEST_LATENCY,
)
REQUEST_INFERENCE_TIME = _vllm(
    "vllm:request_inference_time_seconds", H, "First scheduled to last token (running, incl. preemptions).",
    unit="seconds", bounds=buckets.REQUEST_LATENCY,
)
REQUEST_PREFILL_TIME = _vllm(
    "vllm:request_prefill_time_seconds", H, "First scheduled to first token (prefill phase).",
    unit="seconds", bounds=buckets.REQUEST_LATENCY,
)
REQUEST_DECODE_TIME = _vllm(
    "vllm:request_decode_time_seconds", H, "First token to last token (decode phase).",
    unit="seconds", bounds=buckets.REQUEST_LATENCY,
)
REQUEST_NUM_PREEMPTIONS = _vllm(
    "vllm:request_num_preemptions", H, "Preemptions per finished request (0.32+).",
    bounds=buckets.REQUEST_NUM_PREEMPTIONS,
)

SPECS: tuple[MetricSpec, ...] = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, NUM_REQUESTS_WAITING_BY_REASON, NUM_REQUESTS_SWAPPED,
    ENGINE_SLEEP_STATE, KV_CACHE_USAGE_PERC, CPU_CACHE_USAGE_PERC, CACHE_CONFIG_INFO,
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, GPU_PREFIX_CACHE_HIT_RATE, CPU_PREFIX_CACHE_HIT_RATE,
    LORA_REQUESTS_INFO, EXTERNAL_PREFIX_CACHE_QUERIES,
    EXTERNAL_PREFIX_CACHE_HITS, MM_CACHE_QUERIES, MM_CACHE_HITS, NUM_PREEMPTIONS, PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED, PROMPT_TOKENS_CACHED_BY_SOURCE, GENERATION_TOKENS,
    REQUEST_SUCCESS, ADMISSION_REJECTIONS, ESTIMATED_FLOPS_PER_GPU, ESTIMATED_READ_BYTES_PER_GPU,
    ESTIMATED_WRITE_BYTES_PER_GPU, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_NUM_GENERATION_TOKENS, REQUEST_PARAMS_N, REQUEST_PARAMS_MAX_TOKENS,
    REQUEST_PREFILL_KV_COMPUTED_TOKENS, ITERATION_TOKENS, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY,
    REQUEST_TIME_PER_OUTPUT_TOKEN, E2E_REQUEST_LATENCY, REQUEST_QUEUE_TIME, REQUEST_INFERENCE_TIME,
    REQUEST_PREFILL_TIME, REQUEST_DECODE_TIME, REQUEST_NUM_PREEMPTIONS,
    CORRUPTED_REQUESTS, WATERMARK_REQUESTS, TOOL_CALL_PARSER_INVOCATIONS, NUM_REQUESTS_KV_FETCH_BY_STAGE,
    KV_OFFLOAD_STORE_BYTES, KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_STORE_TIME, KV_OFFLOAD_LOAD_TIME,
    KV_OFFLOAD_STORE_SIZE, KV_OFFLOAD_LOAD_SIZE, KV_OFFLOAD_LOOKUP_SYNC_DELAY, KV_OFFLOAD_LOOKUP_ASYNC_DELAY,
    KV_OFFLOAD_ALLOCATION_FAILURE, KV_OFFLOAD_CONFIG_INFO, KV_OFFLOAD_CPU_CACHE_USAGE_PERC,
    KV_OFFLOAD_CPU_CACHE_WRITE_USAGE_PERC, KV_OFFLOAD_CPU_CACHE_READ_USAGE_PERC, KV_OFFLOAD_CPU_ALLOCATION_SIZE,
    KV_OFFLOAD_STORES_SKIPPED, KV_OFFLOAD_TOTAL_BYTES, KV_OFFLOAD_TOTAL_TIME, KV_OFFLOAD_SIZE,
)
"""Every vLLM family the sidecar knows: the 39 of 0.32, the V0-only gauges, the LoRA info gauge, and the 0.33
families that appear only when a feature is on (NaN checks, watermarking, tool-call parsing, KV transfer and
offloading)."""

CONDITIONAL_0_33: tuple[MetricSpec, ...] = (
    CORRUPTED_REQUESTS, WATERMARK_REQUESTS, TOOL_CALL_PARSER_INVOCATIONS, NUM_REQUESTS_KV_FETCH_BY_STAGE,
    KV_OFFLOAD_STORE_BYTES, KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_STORE_TIME, KV_OFFLOAD_LOAD_TIME,
    KV_OFFLOAD_STORE_SIZE, KV_OFFLOAD_LOAD_SIZE, KV_OFFLOAD_LOOKUP_SYNC_DELAY, KV_OFFLOAD_LOOKUP_ASYNC_DELAY,
    KV_OFFLOAD_ALLOCATION_FAILURE, KV_OFFLOAD_CONFIG_INFO, KV_OFFLOAD_CPU_CACHE_USAGE_PERC,
    KV_OFFLOAD_CPU_CACHE_WRITE_USAGE_PERC, KV_OFFLOAD_CPU_CACHE_READ_USAGE_PERC, KV_OFFLOAD_CPU_ALLOCATION_SIZE,
    KV_OFFLOAD_STORES_SKIPPED, KV_OFFLOAD_TOTAL_BYTES, KV_OFFLOAD_TOTAL_TIME, KV_OFFLOAD_SIZE,
)
"""0.33 families registered only with a feature switched on (read from the 0.33.0 wheel's source)."""

_NOT_DEFAULT_IN_CURRENT = (
    NUM_REQUESTS_SWAPPED, CPU_CACHE_USAGE_PERC, GPU_PREFIX_CACHE_HIT_RATE, CPU_PREFIX_CACHE_HIT_RATE,
    LORA_REQUESTS_INFO, *CONDITIONAL_0_33,
)
CURRENT_FAMILIES: tuple[MetricSpec, ...] = tuple(
    s for s in SPECS if all(s is not other for other in _NOT_DEFAULT_IN_CURRENT)
)
"""The 39 families a vLLM 0.32 server exposes by default."""
