"""Histogram bucket bounds shared with vLLM's own families (vLLM 0.32/0.33 defaults).

The sidecar's latency histograms use exactly these bounds so that its series can be
compared bucket for bucket with vLLM's (and so that an SLO threshold falls on a bound).
"""

from __future__ import annotations

from typing import cast

from prometheus_client.utils import floatToGoString

REQUEST_LATENCY: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
"""vLLM ``request_latency`` family: e2e, queue, inference, prefill and decode times."""

TIME_TO_FIRST_TOKEN: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
"""vLLM ``time_to_first_token`` family."""

INTER_TOKEN_LATENCY: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)
"""vLLM ``inter_token_latency`` family (also time per output token)."""

ITERATION_TOKENS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)
"""vLLM ``iteration_tokens`` family: tokens per engine step."""

REQUEST_NUM_PREEMPTIONS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)
"""vLLM ``request_num_preemptions`` family."""


def request_tokens(max_model_len: int = 32768) -> tuple[float, ...]:
    """vLLM ``request_tokens`` family: a 1-2-5 series capped at ``max_model_len``."""
    bounds: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(float(value))
        exponent += 1


REQUEST_TOKENS: tuple[float, ...] = request_tokens()
"""Token-count bounds for the sidecar's prompt/completion histograms (max length 32k)."""


def le_label(bound: float) -> str:
    """A bucket bound as the ``le`` label value Prometheus's client writes (Go's float formatting, ``+Inf``)."""
    return cast(str, floatToGoString(bound))  # type: ignore[no-untyped-call]  # prometheus_client is untyped here
