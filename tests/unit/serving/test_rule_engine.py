"""Tests of the sidecar's embedded rule engine: ingest, stale markers, delivery, restart."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Gauge

from alert_rules.engine_config import EngineConfig
from alert_rules.promql.values import is_stale, labels_of
from exporters.catalog import engine as engine_specs
from exporters.catalog import rules as rule_specs
from exporters.catalog import vllm as vllm_specs
from serving.rule_engine import RuleRunner, rule_engine_ctx

DATA = Path(__file__).resolve().parents[2] / "data"
KV = engine_specs.KV_USAGE
RUNNING = vllm_specs.NUM_REQUESTS_RUNNING
STEP_MS = 15_000


def rules(for_: str = "30s") -> dict[str, Any]:
    """One alert on the sidecar's KV usage gauge, held for ``for_``."""
    return {"groups": [{"name": "kv", "rules": [{
        "alert": "KVFull", "expr": f"{KV.series} > 0.9", "for": for_,
        "labels": {"severity": "critical"},
        "annotations": {"summary": "KV cache of {{ $labels.model_name }} at {{ $value }}"},
    }]}]}


def kv_registry(value: float) -> tuple[CollectorRegistry, Gauge]:
    """A registry holding the KV usage gauge of model ``m`` at ``value``."""
    registry = CollectorRegistry()
    gauge = Gauge(KV.name, KV.help, KV.labels, registry=registry)
    gauge.labels(*("m" if label == "model_name" else "x" for label in KV.labels)).set(value)
    return registry, gauge


def notifications(registry: CollectorRegistry, target: str, result: str) -> float:
    """The engine's notification counter for one target and result (0 when never touched)."""
    value = registry.get_sample_value(rule_specs.RULE_NOTIFICATIONS.series, dict(
        zip(rule_specs.RULE_NOTIFICATIONS.labels, (target, result), strict=True)))
    return value or 0.0


class Recorder:
    """A ``post`` callable that keeps what it was given, or raises when told to."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []
        self.error = error

    def __call__(self, url: str, body: bytes) -> None:
        """Record the POST, then fail if configured to."""
        self.calls.append((url, json.loads(body)))
        if self.error is not None:
            raise self.error


def runner(registry: CollectorRegistry, post: Recorder | None = None, *, state_file: str = "",
           text: str | None = None, doc: dict[str, Any] | None = None,
           metrics: CollectorRegistry | None = None) -> RuleRunner:
    """A runner ingesting ``registry`` and exporting its own metrics there (as the sidecar does) or
    into ``metrics``, posting to a fake Alertmanager URL."""
    config = EngineConfig(alertmanager_url="http://127.0.0.1:9093", state_file=state_file,
                          resend_delay_s=60.0)
    return RuleRunner(config, doc or rules(), registry, (lambda: text) if text is not None else None,
                      post, metrics or registry, interval_s=STEP_MS / 1000)


def test_registry_samples_are_ingested_with_their_labels() -> None:
    """A gauge of the sidecar's registry is in the store after one step, as an instant query sees it."""
    registry, _ = kv_registry(0.5)
    engine = runner(registry)
    engine.step(1_000_000)
    found = engine.store.instant(KV.series, [], 1_000_000, 300_000)
    assert [(dict(labels).get("model_name"), value) for labels, value in found] == [("m", 0.5)]


def test_vllm_exposition_text_is_ingested() -> None:
    """Series of the captured vLLM 0.32 exposition are stored under their own names and labels."""
    registry = CollectorRegistry()
    engine = runner(registry, text=(DATA / "vllm_v1_engine_0.32.prom").read_text())
    engine.step(1_000_000)
    found = engine.store.instant(RUNNING.series, [], 1_000_000, 300_000)
    assert found == [(labels_of({"__name__": RUNNING.series, "engine": "0", "model_name": "tiny-llm"}), 2.0)]


def test_unparsable_exposition_is_counted_not_raised() -> None:
    """A broken vLLM text adds a failure and leaves the sidecar's own samples ingested."""
    registry, _ = kv_registry(0.5)
    engine = runner(registry, text='broken{label="unterminated 1\n')
    engine.step(1_000_000)
    assert registry.get_sample_value(rule_specs.RULE_EVALUATION_FAILURES.series) == 1.0
    assert len(engine.store.instant(KV.series, [], 1_000_000, 300_000)) == 1


def test_vanished_series_get_a_stale_marker() -> None:
    """A series missing from the next scrape is marked stale at once, so queries stop seeing it."""
    registry, gauge = kv_registry(0.5)
    gauge.labels(*("other" if label == "model_name" else "x" for label in KV.labels)).set(0.7)
    engine = runner(registry)
    engine.step(1_000_000)
    assert len(engine.store.instant(KV.series, [], 1_000_000, 300_000)) == 2
    gauge.remove(*("other" if label == "model_name" else "x" for label in KV.labels))
    engine.step(1_000_000 + STEP_MS)
    found = engine.store.instant(KV.series, [], 1_000_000 + STEP_MS, 300_000)
    assert [dict(labels)["model_name"] for labels, _ in found] == ["m"]
    (gone,) = [s for s in engine.store.series(KV.series, []) if s.mapping["model_name"] == "other"]
    assert (gone.ts[-1], is_stale(gone.vs[-1])) == (1_000_000 + STEP_MS, True)


def test_pending_then_firing_is_posted_once_with_the_alertmanager_payload() -> None:
    """Nothing is sent while pending; on firing one POST to /api/v2/alerts carries labels, annotations, times."""
    registry, _ = kv_registry(0.95)
    post = Recorder()
    engine = runner(registry, post)
    t0 = 1_700_000_000_000
    engine.step(t0)
    engine.step(t0 + STEP_MS)
    assert post.calls == []
    assert [a.state for a in engine.engine.alerts()] == ["pending"]
    engine.step(t0 + 2 * STEP_MS)
    assert len(post.calls) == 1
    url, body = post.calls[0]
    assert url == "http://127.0.0.1:9093/api/v2/alerts"
    (alert,) = body
    assert alert["labels"]["alertname"] == "KVFull"
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["model_name"] == "m"
    assert alert["annotations"] == {"summary": "KV cache of m at 0.95"}
    assert alert["startsAt"] == "2023-11-14T22:13:50.000Z"
    assert alert["endsAt"] > alert["startsAt"]
    assert alert["generatorURL"].startswith("http://127.0.0.1:9100/graph?g0.expr=")
    assert notifications(registry, "alertmanager", "sent") == 1.0
    engine.step(t0 + 3 * STEP_MS)
    assert len(post.calls) == 1


def test_delivery_failures_are_counted_and_never_raised() -> None:
    """A POST that raises is counted as failed, and the cycle still completes and exports its gauges."""
    registry, _ = kv_registry(0.95)
    post = Recorder(ConnectionRefusedError("alertmanager down"))
    engine = runner(registry, post, doc=rules(for_="0s"))
    sent = engine.step(1_700_000_000_000)
    assert len(sent) == 1
    assert len(post.calls) == 1
    assert notifications(registry, "alertmanager", "failed") == 1.0
    assert notifications(registry, "alertmanager", "sent") == 0.0
    assert registry.get_sample_value(rule_specs.RULE_ALERTS.series, {"state": "firing"}) == 1.0


def test_restart_restores_state_without_a_second_notification_inside_the_resend_delay(tmp_path: Path) -> None:
    """After a restart the firing alert is restored from the state file; it is resent only after the delay."""
    registry, _ = kv_registry(0.95)
    state = tmp_path / "alerts.json"
    post = Recorder()
    t0 = int(time.time() * 1000)
    first = runner(registry, post, state_file=str(state))
    for k in range(3):
        first.step(t0 + k * STEP_MS)
    assert len(post.calls) == 1
    assert state.exists()
    fired_at = json.loads(state.read_text())["alerts"]["KVFull"][0]["fired_at_ms"]

    second = runner(registry, post, state_file=str(state), metrics=CollectorRegistry())
    (restored,) = second.engine.alerts()
    assert (restored.state, restored.fired_at_ms) == ("firing", fired_at)
    second.step(t0 + 3 * STEP_MS)
    second.step(t0 + 5 * STEP_MS)
    assert len(post.calls) == 1
    second.step(t0 + 7 * STEP_MS)
    assert len(post.calls) == 2
    assert post.calls[1][1][0]["startsAt"] == post.calls[0][1][0]["startsAt"]


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1, "alerts": {"KVFull": [{"x": 1}]}}'],
                         ids=["not JSON", "a list, not a mapping", "an alert with unknown fields"])
def test_unreadable_state_file_is_ignored(tmp_path: Path, text: str) -> None:
    """A corrupt state file is logged and skipped; the engine starts, with no alerts."""
    registry, _ = kv_registry(0.1)
    state = tmp_path / "alerts.json"
    state.write_text(text)
    engine = runner(registry, state_file=str(state))
    assert engine.engine.alerts() == []


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 5 s) for a delivery result: the cycle's thread counts it after the POST returns."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)


async def _engine_posting_to(
    aiohttp_server: Callable[..., Awaitable[TestServer]], alerts: Callable[[web.Request], Awaitable[web.Response]]
) -> tuple[CollectorRegistry, AsyncIterator[None]]:
    """Start the engine's cleanup context (an always-firing rule) posting to an Alertmanager stand-in."""
    app = web.Application()
    app.router.add_post("/api/v2/alerts", alerts)
    server = await aiohttp_server(app)
    registry, _ = kv_registry(0.95)
    config = EngineConfig(alertmanager_url=str(server.make_url("")), resend_delay_s=60.0)
    ctx = rule_engine_ctx(config, lambda: rules(for_="0s"), registry, interval_s=0.02)
    running = ctx(web.Application())
    await running.__anext__()
    return registry, running


async def test_context_posts_a_firing_alert_to_alertmanager(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    """Run by the cleanup context, the engine posts the firing alert to a real HTTP Alertmanager stand-in."""
    received: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()

    async def alerts(request: web.Request) -> web.Response:
        await received.put(await request.json())
        return web.json_response({})

    registry, running = await _engine_posting_to(aiohttp_server, alerts)
    try:
        body = await asyncio.wait_for(received.get(), timeout=5)
        await until(lambda: notifications(registry, "alertmanager", "sent") > 0)
    finally:
        with pytest.raises(StopAsyncIteration):
            await running.__anext__()
    assert [a["labels"]["alertname"] for a in body] == ["KVFull"]
    assert body[0]["annotations"] == {"summary": "KV cache of m at 0.95"}
    assert notifications(registry, "alertmanager", "sent") == 1.0


async def test_context_counts_an_alertmanager_error_response(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    """An HTTP 500 from Alertmanager is a failed delivery, counted; the engine keeps running."""
    hits: asyncio.Queue[int] = asyncio.Queue()

    async def alerts(_request: web.Request) -> web.Response:
        await hits.put(1)
        return web.Response(status=500, text="boom")

    registry, running = await _engine_posting_to(aiohttp_server, alerts)
    try:
        await asyncio.wait_for(hits.get(), timeout=5)
        await until(lambda: notifications(registry, "alertmanager", "failed") > 0)
    finally:
        with pytest.raises(StopAsyncIteration):
            await running.__anext__()
    assert notifications(registry, "alertmanager", "failed") == 1.0
    assert notifications(registry, "alertmanager", "sent") == 0.0


async def test_disabled_engine_runs_nothing() -> None:
    """With the engine disabled the context yields at once and registers no families."""
    registry = CollectorRegistry()
    ctx = rule_engine_ctx(EngineConfig(enabled=False), rules, registry, interval_s=0.02)
    running = ctx(web.Application())
    await running.__anext__()
    with pytest.raises(StopAsyncIteration):
        await running.__anext__()
    assert registry.get_sample_value(rule_specs.RULE_EVALUATION_FAILURES.series) is None
