"""Per-request values shared by the proxy, the metrics and the log pipeline."""

from __future__ import annotations

import bisect
import enum
import itertools
from dataclasses import dataclass, field

from exporters.engine_stats_wire import EngineRequestStats

DEFAULT_LENGTH_EDGES: tuple[int, ...] = (512, 2048, 8192, 32768)


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


def long_length_buckets(edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES, above: int = 8192) -> tuple[str, ...]:
    """Labels of the buckets whose prompts are all longer than ``above`` tokens."""
    labels = length_bucket_labels(edges)
    return tuple(label for label, lower in zip(labels, (0, *edges), strict=True) if lower >= above)


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
    inter_token_s: list[float] = field(default_factory=list)
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
    engine: EngineRequestStats | None = None
    """vLLM's own numbers for the request, from the stat-logger plugin (serve.engine_stats_listen)."""

    @property
    def mean_itl_s(self) -> float | None:
        """Mean gap between content chunks, or None for a non-streamed request."""
        if not self.inter_token_s:
            return None
        return sum(self.inter_token_s) / len(self.inter_token_s)
