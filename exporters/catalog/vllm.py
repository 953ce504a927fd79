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
)
"""Every vLLM family the sidecar knows: the 39 of 0.32, the V0-only gauges and the LoRA info gauge."""

_NOT_DEFAULT_IN_CURRENT = (
    NUM_REQUESTS_SWAPPED, CPU_CACHE_USAGE_PERC, GPU_PREFIX_CACHE_HIT_RATE, CPU_PREFIX_CACHE_HIT_RATE,
    LORA_REQUESTS_INFO,
)
CURRENT_FAMILIES: tuple[MetricSpec, ...] = tuple(
    s for s in SPECS if all(s is not other for other in _NOT_DEFAULT_IN_CURRENT)
)
"""The 39 families a vLLM 0.32 server exposes by default."""
