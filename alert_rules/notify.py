"""Alertmanager API v2 payloads and resend decisions, as Prometheus' notifier makes them (pure)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Notification:
    """One alert to post: labels, annotations, start and end (ms since the epoch), the expression."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at_ms: int
    ends_at_ms: int | None
    expr: str = ""


def needs_sending(state: str, resolved_at_ms: int | None, last_sent_ms: int | None, now_ms: int,
                  resend_delay_ms: int) -> bool:
    """Prometheus' rule: never pending; a new resolution at once; otherwise every resend delay."""
    if state == "pending":
        return False
    if resolved_at_ms is not None and (last_sent_ms is None or resolved_at_ms > last_sent_ms):
        return True
    if last_sent_ms is None:
        return True
    return last_sent_ms + resend_delay_ms < now_ms


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as an RFC 3339 UTC timestamp with milliseconds."""
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def generator_url(base: str, expr: str) -> str:
    """Prometheus' table link for an expression (``/graph?g0.expr=...&g0.tab=1``)."""
    return f"{base.rstrip('/')}/graph?g0.expr={quote(expr, safe='')}&g0.tab=1"


def alert_payload(item: Notification, external_labels: Mapping[str, str] | None = None,
                  base_url: str = "") -> dict[str, object]:
    """One element of the ``POST /api/v2/alerts`` array; external labels are added, never override."""
    labels = {**(external_labels or {}), **item.labels}
    payload: dict[str, object] = {
        "labels": {k: str(v) for k, v in labels.items()},
        "annotations": {k: str(v) for k, v in item.annotations.items()},
        "startsAt": rfc3339(item.starts_at_ms),
        "generatorURL": generator_url(base_url or "http://127.0.0.1", item.expr),
    }
    if item.ends_at_ms is not None:
        payload["endsAt"] = rfc3339(max(item.ends_at_ms, item.starts_at_ms))
    return payload


def alertmanager_body(items: Iterable[Notification], external_labels: Mapping[str, str] | None = None,
                      base_url: str = "") -> bytes:
    """The JSON array body for Alertmanager's ``POST /api/v2/alerts``."""
    return json.dumps([alert_payload(i, external_labels, base_url) for i in items]).encode()


def webhook_body(items: Iterable[Notification], now_ms: int,
                 external_labels: Mapping[str, str] | None = None, base_url: str = "") -> bytes:
    """A webhook body shaped like Alertmanager's version 4 (for sites without an Alertmanager)."""
    alerts = []
    for item in items:
        payload = alert_payload(item, external_labels, base_url)
        ended = item.ends_at_ms is not None and item.ends_at_ms <= now_ms
        payload["status"] = "resolved" if ended else "firing"
        alerts.append(payload)
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return json.dumps({"version": "4", "status": status, "receiver": "inferwatch",
                       "alerts": alerts}).encode()
