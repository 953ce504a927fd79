"""Series written by inferwatch's own recording rules (in Prometheus and in the embedded engine)."""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType, Source

SLO_LABELS = ("model_name", "slo")

SLO_EVENTS = MetricSpec(
    "inferwatch:slo_events:sum", MetricType.GAUGE,
    "Every event an SLO counts (a sum of counters), per model and slo.", SLO_LABELS, source=Source.RECORDING,
)
SLO_BAD_EVENTS = MetricSpec(
    "inferwatch:slo_bad_events:sum", MetricType.GAUGE,
    "The events that miss the SLO (a sum of counters), per model and slo.", SLO_LABELS, source=Source.RECORDING,
)
SLO_ENGINE_REJECTIONS = MetricSpec(
    "inferwatch:slo_engine_rejections:sum", MetricType.GAUGE,
    "vLLM's own admission rejections (a sum of counters), per model, labelled slo=\"availability\".",
    SLO_LABELS, source=Source.RECORDING,
)
SLO_OVERLOADED_SEEN = MetricSpec(
    "inferwatch:slo_overloaded_seen:sum", MetricType.GAUGE,
    "Requests the sidecar answered as overloaded (its own 503s and the upstream's 429/503s; a sum of counters), "
    "per model, labelled slo=\"availability\".",
    SLO_LABELS, source=Source.RECORDING,
)
SLO_ERROR_RATIO_PREFIX = "inferwatch:slo_error:ratio_rate"
"""Recorded bad / all events over a window: the name is this prefix plus the window, e.g. ``...rate5m``."""


def slo_error_ratio(window: str) -> str:
    """Name of the recorded SLO error ratio over ``window`` (a Prometheus duration such as ``5m``)."""
    return f"{SLO_ERROR_RATIO_PREFIX}{window}"


SLO_EVENTS_INCREASE_PREFIX = "inferwatch:slo_events:increase"
"""Recorded count of every event an SLO counted over a window (the error ratio's denominator as a count): the
name is this prefix plus the window, e.g. ``...increase1h``; the burn alerts need a minimum of it."""


def slo_events_increase(window: str) -> str:
    """Name of the recorded count of an SLO's events over ``window`` (a Prometheus duration such as ``1h``)."""
    return f"{SLO_EVENTS_INCREASE_PREFIX}{window}"


SPECS: tuple[MetricSpec, ...] = (SLO_EVENTS, SLO_BAD_EVENTS, SLO_ENGINE_REJECTIONS, SLO_OVERLOADED_SEEN)
