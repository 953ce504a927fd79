"""What one load-test step sends and how fast, and the range checks of the command-line options."""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporters.configuring import http_url
from exporters.errors import ConfigError
from serving.loadtest import backoff

MAX_REQUESTS = 1_000_000
MAX_DURATION_S = 86_400.0
MAX_CONCURRENCY = 4096
MAX_RATE = 100_000.0
MAX_TOKENS_LIMIT = 1_048_576
ARRIVALS = ("fixed", "poisson", "scheduled")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to send, how much, and how fast (one step of a load test).

    ``arrivals`` shapes an open-loop schedule: ``fixed`` sends request ``i`` at ``i / rate``
    seconds, ``poisson`` at the sum of ``i`` exponential gaps of mean ``1 / rate`` (seeded), and
    ``scheduled`` at offsets given with the run (a replay or a ramp; ``rate`` is then their mean rate).
    In a closed loop a worker backs off after a failed request (``backoff.Backoff``: from
    ``retry_initial_ms`` doubling up to ``retry_max_ms``, with jitter); an open loop keeps its schedule.
    """

    url: str
    model: str
    requests: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None
    rate: float | None = None
    stream: bool = True
    chat: bool = False
    prompt_tokens: int = 32
    max_tokens: int = 64
    ignore_eos: bool = False
    timeout_s: float = 60.0
    max_in_flight: int = 256
    arrivals: str = "fixed"
    seed: int = 0
    retry_initial_ms: float = backoff.INITIAL_MS
    retry_max_ms: float = backoff.MAX_MS

    def validate(self) -> LoadSpec:
        """Return the spec when it is bounded and in range; raise ConfigError naming the option otherwise."""
        check_url(self.url)
        if not self.model:
            raise ConfigError("--model", "must name the served model")
        if self.requests is None and self.duration_s is None:
            raise ConfigError("--requests", "a load test must be bounded: give a request count or a duration")
        check_range("--requests", self.requests, 1, MAX_REQUESTS)
        check_range("--duration", self.duration_s, 0.0, MAX_DURATION_S, open_low=True)
        if self.concurrency is not None and self.rate is not None:
            raise ConfigError("--rate", "give either a concurrency or a rate, not both", self.rate)
        if self.concurrency is None and self.rate is None:
            raise ConfigError("--concurrency", "give a concurrency (closed loop) or a rate (open loop)")
        check_range("--concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        check_range("--rate", self.rate, 0.0, MAX_RATE, open_low=True)
        check_range("--prompt-tokens", self.prompt_tokens, 1, MAX_TOKENS_LIMIT)
        check_range("--max-tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT)
        check_range("--timeout", self.timeout_s, 0.0, MAX_DURATION_S, open_low=True)
        check_range("--max-in-flight", self.max_in_flight, 1, MAX_CONCURRENCY)
        check_range("--retry-initial-ms", self.retry_initial_ms, 0.0, MAX_DURATION_S * 1000, open_low=True)
        check_range("--retry-max-ms", self.retry_max_ms, self.retry_initial_ms, MAX_DURATION_S * 1000)
        if self.arrivals not in ARRIVALS:
            raise ConfigError("--arrivals", f"must be one of {', '.join(ARRIVALS)}", self.arrivals)
        return self

    @property
    def endpoint(self) -> str:
        """The full URL requests are posted to."""
        return endpoint(self.url, chat=self.chat)

    @property
    def pace(self) -> str:
        """How the step is paced, e.g. ``concurrency 4`` or ``2 req/s (poisson)``."""
        if self.rate is not None:
            return f"{self.rate:.3g} req/s ({'mean, scheduled' if self.arrivals == 'scheduled' else self.arrivals})"
        return f"concurrency {self.concurrency}"


def check_range(key: str, value: float | None, low: float, high: float, *, open_low: bool = False) -> None:
    """Raise ConfigError naming ``key`` unless ``value`` is None or a finite number within the bounds."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, "must be a finite number", value)
    if value < low or (open_low and value == low) or value > high:
        lower = f"> {low:g}" if open_low else f">= {low:g}"
        raise ConfigError(key, f"must be {lower} and <= {high:g}", value)


def check_url(url: str) -> str:
    """Return ``url`` when it is an http(s) URL with a host; raise ConfigError otherwise."""
    problem = http_url(url)
    if problem is not None:
        raise ConfigError("--url", problem, url)
    return url


def base_url(url: str) -> str:
    """The server's root URL: ``url`` without a trailing ``/`` or ``/v1``."""
    return url.rstrip("/").removesuffix("/v1")


def endpoint(url: str, *, chat: bool) -> str:
    """The completions (or chat completions) URL under a base URL, which may already end in ``/v1``."""
    base = base_url(url)
    return f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"
