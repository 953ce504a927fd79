"""Per-request values shared by the proxy, the metrics and the log pipeline."""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporters.engine_stats_wire import EngineRequestStats

DEFAULT_LENGTH_EDGES: tuple[int, ...] = (512, 4096, 16384, 32768)
"""Five classes, as many as before: each of the launch guide's lengths (512, 8k, 32k) in a class of its own
(``le512``, ``4k-16k``, ``16k-32k``), 4,096 (the long-prompt lane's threshold) as an edge, and ``gt32k``.
Each edge is the inclusive upper end of its class: 512 tokens is ``le512``, 513 is ``512-4k``."""
CONTEXT_32K_TOKENS = 32000
"""A "32k request" of the launch guide: its class is watched on its own (InferwatchContext32kFailures)."""


class Outcome(enum.StrEnum):
    """How a proxied request ended."""

    OK = "ok"
    CLIENT_ERROR = "client_error"  # 4xx from upstream or a request we refused (bad JSON)
    UPSTREAM_ERROR = "upstream_error"  # 5xx other than overload, connection refused, broken stream
    TIMEOUT = "timeout"  # the upstream did not answer or stalled past the configured timeout
    CANCELLED = "cancelled"  # the client went away before the response was complete
    OVERLOADED = "overloaded"  # 429 or 503 from the upstream (admission rejected, queue full)

    @property
    def is_error(self) -> bool:
        """True for outcomes that count against the availability SLO."""
        return self in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT, Outcome.OVERLOADED)


def outcome_of_status(status: int) -> Outcome:
    """The outcome class of an upstream's HTTP status."""
    if status < 400:
        return Outcome.OK
    if status in (429, 503):
        return Outcome.OVERLOADED
    if status < 500:
        return Outcome.CLIENT_ERROR
    return Outcome.UPSTREAM_ERROR


def _format_tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def length_bucket_labels(edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> tuple[str, ...]:
    """Labels of the prompt length buckets, e.g. ``le512``, ``512-2k``, ..., ``gt32k``."""
    labels = [f"le{_format_tokens(edges[0])}"]
    labels += [f"{_format_tokens(a)}-{_format_tokens(b)}" for a, b in itertools.pairwise(edges)]
    labels.append(f"gt{_format_tokens(edges[-1])}")
    return tuple(labels)


def length_bucket(prompt_tokens: int | None, edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> str:
    """The length bucket label of a prompt; ``unknown`` when its length is not known."""
    if prompt_tokens is None:
        return "unknown"
    return length_bucket_labels(edges)[bisect.bisect_left(edges, prompt_tokens)]


def context_32k_bucket(edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> str:
    """The length class a 32,000-token prompt lands in: the one InferwatchContext32kFailures watches and the SLO
    board's 32k panel draws."""
    return length_bucket(CONTEXT_32K_TOKENS, edges)


def long_length_buckets(edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES, above: int = 4096) -> tuple[str, ...]:
    """Labels of the buckets whose prompts are all longer than ``above`` tokens (exactly the prompts of more
    than ``above`` tokens when ``above`` is an edge)."""
    labels = length_bucket_labels(edges)
    return tuple(label for label, lower in zip(labels, (0, *edges), strict=True) if lower >= above)


@dataclass(frozen=True, slots=True)
class AnswerPhases:
    """What the engine said about one request in its answer (seconds; tokens; None where it does not say)."""

    engine: str
    prefill_s: float
    decode_s: float
    load_s: float | None = None
    total_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    generated_tokens: int | None = None


@dataclass(slots=True)
class RequestRecord:
    """What the sidecar measured about one request. Times are seconds; None when not reached."""

    trace_id: str
    span_id: str
    route: str
    model: str = "unknown"
    stream: bool = False
    upstream: str = ""
    http_status: int = 0
    outcome: Outcome = Outcome.OK
    length_bucket: str = "unknown"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    accept_s: float | None = None
    upstream_sent_s: float | None = None
    """When the request went out to the upstream (after admission, the body and a connection)."""
    connect_s: float = 0.0
    """Time spent opening a new upstream connection for it (0 on a reused one)."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    inter_token_s: Sequence[float] = field(default_factory=list)
    """Seconds between content chunks: an ``array('d')`` from the proxy (compact while the explain ring keeps it),
    a list from a secondary worker's wire or a test."""
    finish_reason: str | None = None
    response_model: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    start_unix: float = 0.0
    prompt_hash: str | None = None
    prompt_chars: int | None = None
    prompt_tokens_estimate: int | None = None
    """The proxy's estimate of the prompt's tokens: the length bucket of a stream cut before its usage chunk."""
    client_wait_s: float = 0.0
    """Time the stream waited for the client to take its bytes (its socket full: a slow reader)."""
    refused: bool = False
    """The sidecar answered it itself (admission, body limits, signature, shedding): it never went upstream."""
    engine: EngineRequestStats | None = None
    """vLLM's own numbers for the request, from the stat-logger plugin (serve.engine_stats_listen)."""
    answer_phases: AnswerPhases | None = None
    """The engine's own numbers that came in its answer (Ollama's final message, llama.cpp's timings)."""
    tenant: str = "unknown"
    """Who sent it (serve.tenant_header or the API-key map), before the label cap; never the key itself."""
    request_class: str | None = None
    """Its class from cost.request_class_header (a special cost pool's class), if given."""
    repeat_key: int | None = None
    """A salted 64-bit hash of its model and prompt, for the repeat-prompt estimate (never the text)."""
    body_key: int | None = None
    """A salted 64-bit hash of its body as the client sent it, for fast retries (never the body)."""
    requested_model: str | None = None
    """The ``model`` the request named, as sent (cut to 128 characters); ``model`` is its bounded label."""
    client: str | None = None
    """Who sent the request: the serve.client_header value, else the User-Agent (cut to 128 characters)."""
    wrong_model: str | None = None
    """``other_model`` or ``retired_model`` for a wrong-model request (exporters/model_match.py), else None."""
    text_class: str = "plain"
    """The prompt's text class: ``plain``, ``emoji_dense`` or ``cjk`` (exporters/text_class.py)."""
    tokenizer_fingerprint: str | None = None
    """The fingerprint of the upstream's tokenizer for the model when the request ended, if known."""
    lane: str = "default"
    """``long`` when the request went to the long-prompt lane (serve.long_prompt_upstream), else ``default``."""
    role: str = "primary"
    """``canary`` when the request went to the canary upstream (serve.canary_upstream), else ``primary``."""
    lane_fallback: str | None = None
    """Why a long prompt did not take the long lane (``not_ready``, ``unreachable``); None when it did or was short."""
    priority_class: str | None = None
    """``high``, ``default`` or ``low`` by the priority header, with serve.pass_priority; else None."""
    shadow_result: str | None = None
    """For a request sampled for the shadow (serve.shadow_upstream): ``match``, ``mismatch`` or ``not_compared``
    when both answered; ``dropped_full``, ``dropped_slow`` or ``dropped_down`` when the shadow copy was dropped."""
    shadow_status: int | None = None
    shadow_outcome: str | None = None
    shadow_ttft_s: float | None = None
    shadow_e2e_s: float | None = None
    shadow_prompt_tokens: int | None = None
    shadow_completion_tokens: int | None = None
    shadow_distance: float | None = None
    """How far the shadow's output is from the client's: 0 the same, 1 nothing in common (see serving/shadow.py)."""

    @property
    def mean_itl_s(self) -> float | None:
        """Mean gap between content chunks, or None for a non-streamed request."""
        if not self.inter_token_s:
            return None
        return sum(self.inter_token_s) / len(self.inter_token_s)
