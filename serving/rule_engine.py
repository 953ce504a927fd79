"""The sidecar's embedded rule engine: ingest scrapes into the store, evaluate, notify.

Every ``rules.evaluation_interval_s`` (apscheduler; the interval the rule files carry) one
cycle runs in a worker thread: samples from the sidecar's own registry, from the extra upstreams'
registries (labelled with their name) and from the latest raw vLLM exposition are appended at the
current time (series that vanished get a stale marker, as Prometheus writes them), due groups are
evaluated, and alerts are posted to Alertmanager's API v2, a webhook and/or stdout. Errors are
logged and counted; they never stop the sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from alert_rules import notify
from alert_rules.engine import RuleEngine, load_groups
from alert_rules.engine_config import EngineConfig
from alert_rules.promql.values import NAME, STALE_NAN, Labels, labels_of
from alert_rules.store import SeriesStore
from exporters.catalog import rules as specs
from exporters.files import write_atomic
from serving.background import PeriodicJobs

log = logging.getLogger(__name__)

RULE_RUNNER: web.AppKey[RuleRunner] = web.AppKey("rule_runner")
"""Where the running engine is found on the app (absent when the embedded engine is off or failed)."""


class _Metrics:
    """The engine's own families, registered on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        s = specs
        self.duration = Histogram(s.RULE_EVALUATION_SECONDS.name, s.RULE_EVALUATION_SECONDS.help,
                                  buckets=s.RULE_EVALUATION_SECONDS.buckets or (), registry=registry)
        self.failures = Counter(s.RULE_EVALUATION_FAILURES.name, s.RULE_EVALUATION_FAILURES.help,
                                registry=registry)
        self.notifications = Counter(s.RULE_NOTIFICATIONS.name, s.RULE_NOTIFICATIONS.help,
                                     s.RULE_NOTIFICATIONS.labels, registry=registry)
        self.alerts = Gauge(s.RULE_ALERTS.name, s.RULE_ALERTS.help, s.RULE_ALERTS.labels, registry=registry)
        self.series = Gauge(s.RULE_STORED_SERIES.name, s.RULE_STORED_SERIES.help, registry=registry)
        self.dropped = Counter(s.RULE_DROPPED_SAMPLES.name, s.RULE_DROPPED_SAMPLES.help,
                               s.RULE_DROPPED_SAMPLES.labels, registry=registry)


def _registry_samples(
    registry: CollectorRegistry, extra: Mapping[str, str] | None = None,
) -> list[tuple[Labels, float]]:
    out = []
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.append((labels_of({**sample.labels, **(extra or {}), NAME: sample.name}), float(sample.value)))
    return out


def _text_samples(text: str) -> list[tuple[Labels, float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.append((labels_of({**sample.labels, NAME: sample.name}), float(sample.value)))
    return out


class RuleRunner:
    """One engine, its store, and the ingest/evaluate/notify cycle (the cycle is synchronous)."""

    def __init__(self, config: EngineConfig, rule_document: Mapping[str, Any],
                 registry: CollectorRegistry | None = None,
                 latest_vllm_text: Callable[[], str | None] | None = None,
                 post: Callable[[str, bytes], None] | None = None,
                 metrics_registry: CollectorRegistry | None = None, interval_s: float = 15.0,
                 annotate: Callable[[notify.Notification], notify.Notification] | None = None,
                 extra_sources: Mapping[str, tuple[CollectorRegistry, Mapping[str, str]]] | None = None) -> None:
        self.config = config
        self.extra_sources = extra_sources or {}
        """More registries, by source name, whose samples are ingested with labels of their own (the extra
        upstreams' engines, serving/extra_upstreams.py)."""
        self.annotate = annotate
        """Adds what only the sidecar knows to an alert about to be sent (the slowest request's trace id)."""
        self.registry = registry
        self.latest_vllm_text = latest_vllm_text
        self.post = post
        self.store = SeriesStore(int(config.retention_s * 1000), config.max_series)
        self.engine = RuleEngine(
            load_groups(rule_document, "rule groups"), self.store,
            default_interval_ms=int(interval_s * 1000), lookback_ms=int(config.lookback_s * 1000),
            recorded_retention_ms=int(config.recorded_retention_s * 1000),
            resend_delay_ms=int(config.resend_delay_s * 1000), external_url=config.external_url,
        )
        self.metrics = _Metrics(metrics_registry)
        self.firing: Mapping[str, tuple[Mapping[str, str], ...]] = {}
        """Label sets of the alerts firing after the last cycle, by alert name: a snapshot replaced whole,
        so the event loop reads it without a lock while the cycle runs in its worker thread."""
        self.alert_snapshot: tuple[dict[str, Any], ...] = ()
        """Every alert held after the last cycle, as JSON (for ``/admin/alerts``); replaced whole, like ``firing``."""
        self._seen: dict[str, set[Labels]] = {}
        self._dropped = (0, 0)
        self._last_gc = 0
        self._restore()

    def _restore(self) -> None:
        path = self.config.state_file
        if not path or not Path(path).exists():
            return
        try:
            state = json.loads(Path(path).read_text())
            count = self.engine.restore(state, int(time.time() * 1000), int(self.config.state_max_age_s * 1000))
            log.info("rule engine: restored %d alerts from %s", count, path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:  # e.g. a list, not a mapping
            log.warning("rule engine: cannot restore alert state from %s: %s", path, err)

    def _save(self) -> None:
        path = self.config.state_file
        if not path:
            return
        write_atomic(path, json.dumps(self.engine.state()))

    def _ingest_source(self, source: str, samples: list[tuple[Labels, float]], now_ms: int) -> None:
        current = set()
        for labels, value in samples:
            self.store.append(labels, now_ms, value)
            current.add(labels)
        for labels in self._seen.get(source, set()) - current:
            self.store.append(labels, now_ms, STALE_NAN)
        self._seen[source] = current

    def ingest(self, now_ms: int) -> None:
        """Append the current samples of every source at ``now_ms``."""
        if self.registry is not None:
            self._ingest_source("sidecar", _registry_samples(self.registry), now_ms)
        for source, (registry, labels) in self.extra_sources.items():
            self._ingest_source(source, _registry_samples(registry, labels), now_ms)
        if self.latest_vllm_text is not None:
            text = self.latest_vllm_text()
            if not text:  # none yet, or vLLM's series went stale (engine down): they end here, not freeze
                self._ingest_source("vllm", [], now_ms)
                return
            try:
                samples = _text_samples(text)
            except (ValueError, TypeError) as err:
                log.warning("rule engine: cannot parse the vLLM exposition: %s", err)
                self.metrics.failures.inc()
            else:
                self._ingest_source("vllm", samples, now_ms)

    def step(self, now_ms: int | None = None) -> list[notify.Notification]:
        """One cycle: ingest, evaluate due groups, notify, save state. Never raises."""
        started = time.perf_counter()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        sent: list[notify.Notification] = []
        try:
            self.ingest(now_ms)
            result = self.engine.evaluate_due(now_ms)
            for error in result.errors:
                log.warning("rule engine: %s", error)
                self.metrics.failures.inc()
            sent = result.to_send
            if sent:
                self._deliver(sent, now_ms)
            if result.transitions or sent:
                self._save()
            if now_ms - self._last_gc > 60_000:
                self.store.gc(now_ms)
                self._last_gc = now_ms
            self._export()
        except Exception:  # a cycle must never take the sidecar down
            log.exception("rule engine: evaluation cycle failed")
            self.metrics.failures.inc()
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)
        return sent

    def firing_label_values(self, alertname: str, label: str) -> frozenset[str]:
        """The values of ``label`` over the firing instances of ``alertname`` (e.g. the degraded models)."""
        return frozenset(labels[label] for labels in self.firing.get(alertname, ()) if label in labels)

    def _export(self) -> None:
        alerts = self.engine.alerts()
        self.alert_snapshot = tuple(a.to_json() for a in alerts)
        self.firing = {
            name: tuple(dict(a.labels) for a in per_rule.values() if a.state == "firing")
            for name, per_rule in self.engine.active.items()
        }
        for state in ("pending", "firing"):
            self.metrics.alerts.labels(state).set(sum(1 for a in alerts if a.state == state))
        self.metrics.series.set(len(self.store))
        out_of_order, limit = self.store.dropped_out_of_order, self.store.dropped_series_limit
        self.metrics.dropped.labels("out_of_order").inc(out_of_order - self._dropped[0])
        self.metrics.dropped.labels("series_limit").inc(limit - self._dropped[1])
        self._dropped = (out_of_order, limit)

    def _deliver(self, items: list[notify.Notification], now_ms: int) -> None:
        if self.annotate is not None:
            try:
                items = [self.annotate(item) for item in items]
            except Exception:  # an annotation never keeps an alert from going out
                log.exception("rule engine: annotating alerts failed; sent as evaluated")
        targets: list[tuple[str, str, bytes]] = []
        base = self.config.external_url
        if self.config.alertmanager_url:
            targets.append(("alertmanager", self.config.alertmanager_url.rstrip("/") + "/api/v2/alerts",
                            notify.alertmanager_body(items, base_url=base)))
        if self.config.webhook_url:
            targets.append(("webhook", self.config.webhook_url, notify.webhook_body(items, now_ms, base_url=base)))
        for target, url, body in targets:
            try:
                if self.post is None:
                    raise RuntimeError("no HTTP sender configured")
                self.post(url, body)
                self.metrics.notifications.labels(target, "sent").inc(len(items))
            except Exception as err:  # delivery problems are counted, never raised
                log.warning("rule engine: sending %d alerts to %s failed: %s", len(items), url, err)
                self.metrics.notifications.labels(target, "failed").inc(len(items))
        if self.config.stdout:
            for item in items:
                print(json.dumps(notify.alert_payload(item, base_url=base)), file=sys.stdout, flush=True)
            self.metrics.notifications.labels("stdout", "sent").inc(len(items))


def rule_engine_ctx(
    config: EngineConfig,
    rule_groups: Callable[[], Mapping[str, Any]],
    registry: CollectorRegistry,
    latest_vllm_text: Callable[[], str | None] | None = None,
    *,
    interval_s: float = 15.0,
    annotate: Callable[[notify.Notification], notify.Notification] | None = None,
    extra_sources: Mapping[str, tuple[CollectorRegistry, Mapping[str, str]]] | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx`` factory running the engine every ``interval_s`` (the rules' interval)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        if not config.enabled:
            yield
            return
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=config.send_timeout_s)
        session = aiohttp.ClientSession(timeout=timeout)

        def post(url: str, body: bytes) -> None:
            async def send() -> None:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    if resp.status >= 300:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")

            asyncio.run_coroutine_threadsafe(send(), loop).result(config.send_timeout_s + 1)

        try:
            runner = RuleRunner(config, rule_groups(), registry, latest_vllm_text, post, registry, interval_s,
                                annotate, extra_sources)
        except Exception:
            log.exception("rule engine: cannot start; alerts will not be evaluated in the sidecar")
            await session.close()
            yield
            return
        app[RULE_RUNNER] = runner
        busy = asyncio.Lock()

        async def tick() -> None:
            if busy.locked():
                return  # the previous cycle is still running: skip rather than pile up
            async with busy:
                await loop.run_in_executor(None, runner.step)

        jobs = PeriodicJobs()
        jobs.every(interval_s, tick, name="rule_engine")
        jobs.start()
        try:
            yield
        finally:
            jobs.stop()
            with contextlib.suppress(Exception):
                await session.close()

    return ctx
