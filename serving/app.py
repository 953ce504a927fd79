"""The composition root: builds the aiohttp application from settings."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import aiohttp
import structlog
from aiohttp import web
from opentelemetry.trace import Span
from prometheus_client import CollectorRegistry

from alert_rules.intervene import DEGRADE_ALERT
from alert_rules.render import rule_groups
from alert_rules.store import SeriesStore
from exporters.catalog.engines import Engine
from exporters.catalog.request import GENERATION_ROUTES
from exporters.cold_start import ColdStartTracker
from exporters.fast_retries import FastRetryCounter
from exporters.genai_metrics import GenAiServerMetrics, provider_name
from exporters.inflight import InFlightRequests, InFlightTokens
from exporters.records import Outcome, RequestRecord
from exporters.request_metrics import RequestMetrics
from exporters.upstream_metrics import UpstreamMetrics
from exporters.usage import UsageAccounting
from log_pipeline.sampling import SPAN_ATTRIBUTE
from log_pipeline.shipper import RecordShipper
from log_pipeline.sink import RecordSink
from serving.admin import ADMIN_MOUNT, admin_app, admin_guard, load_admin_token
from serving.admission import Admission
from serving.background import PeriodicJobs
from serving.config import Settings
from serving.cutover import CutoverWatch, request_describer
from serving.endpoints import Readiness, healthz, json_errors, metrics_handler
from serving.engine_detect import DEFAULT_READINESS_PATH, EngineDetector, engine_detect_ctx
from serving.engine_stats import ENGINE_STATS, EngineStatsJoin, engine_stats_ctx
from serving.engine_watch import ENGINE_WATCH, engine_watch_ctx
from serving.exchange import aiohttp_handler
from serving.explain import ContextSources, RequestRing, add_explain_routes, with_slowest_request
from serving.extra_upstreams import EXTRA_METRICS_PATH, ExtraUpstreams, extra_targets
from serving.front import Front
from serving.ollama_watch import ollama_watch_ctx
from serving.otlp_logs import otlp_shipper
from serving.proxy import FinishHook, Observer, Proxy, run_observers
from serving.rule_engine import RULE_RUNNER, rule_engine_ctx
from serving.shadow import ShadowCopies, add_shadow_routes
from serving.showback.schedule import showback_schedule_ctx
from serving.showback.sidecar import USAGE_PATH, usage_handler
from serving.signing import SignatureVerifier, load_key
from serving.tenancy import Tenancy
from serving.tracing import Tracing
from serving.upstream_choice import readiness_ctx as upstream_readiness_ctx
from serving.upstream_http import upstream_address
from serving.workers import (
    FORWARDED_PATHS,
    RECORDS_PATH,
    PrimaryForwarder,
    PrimaryLink,
    RecordForwarder,
    RecordIntake,
    forwarder_ctx,
    shares,
    watch_parent,
)

log = structlog.get_logger(__name__)

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", CollectorRegistry)
SESSION = web.AppKey("session", aiohttp.ClientSession)
TRACING = web.AppKey("tracing", Tracing)
INFLIGHT = web.AppKey("inflight", InFlightTokens)
IN_FLIGHT_REQUESTS = web.AppKey("in_flight_requests", InFlightRequests)
METRICS = web.AppKey("request_metrics", RequestMetrics)
READINESS = web.AppKey("readiness", Readiness)
OBSERVERS = web.AppKey("observers", list)
PROXY = web.AppKey("proxy", Proxy)
GENAI = web.AppKey("genai_metrics", GenAiServerMetrics)
SINK = web.AppKey("record_sink", RecordSink)
SHIPPER = web.AppKey("record_shipper", RecordShipper)
COLD_STARTS = web.AppKey("cold_starts", ColdStartTracker)
USAGE = web.AppKey("usage", UsageAccounting)


def server_options(settings: Settings) -> dict[str, object]:
    """The aiohttp server settings the sidecar runs with (``serve`` and the tests use the same); aiohttp
    serves the connections the front hands over (serving/front.py applies the same limits to its own)."""
    return {
        # aiohttp closes a connection that has not delivered a complete request head within the
        # keep-alive timeout, counted from the connection's start or its previous answer: that
        # is the slow-header (slowloris) limit.
        "keepalive_timeout": settings.serve.client_header_timeout_s,
        "handler_cancellation": True,  # a client that leaves cancels its upstream request
        "access_log": None,
    }


def build_app(settings: Settings, registry: CollectorRegistry | None = None) -> web.Application:
    """Build the sidecar application; background work starts when the app starts.

    Raises:
        ConfigError: the HMAC key or the admin token cannot be read.
    """
    admin_token = load_admin_token(settings.serve.admin_token_file)
    app = web.Application(client_max_size=settings.serve.max_body_bytes, middlewares=[json_errors])
    registry = registry if registry is not None else CollectorRegistry()
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[TRACING] = Tracing(settings.tracing.service_name, settings.tracing.otlp_endpoint)
    app[INFLIGHT] = InFlightTokens()
    app[IN_FLIGHT_REQUESTS] = InFlightRequests()
    registry.register(app[IN_FLIGHT_REQUESTS])
    metrics = RequestMetrics(registry)
    app[METRICS] = metrics
    upstream_metrics = UpstreamMetrics(registry, settings.serve.long_prompt_fallback)

    def observe_metrics(record: RequestRecord, _span: Span) -> None:
        metrics.observe(record)
        upstream_metrics.observe(record)  # lane fallbacks, estimate error, priority classes, shadow

    sink = RecordSink(settings.logs, registry)
    app[SINK] = sink
    shipper = otlp_shipper(settings.logs, settings.tracing.service_name, registry)
    if shipper is not None:
        app[SHIPPER] = shipper

    def observe_logs(record: RequestRecord, span: Span) -> None:
        decision, event = sink.offer_request(record, sla_s=settings.rules.sla_for(record.model),
                                             capture_prompt_hash=settings.logs.capture_prompt_hash)
        span.set_attribute(SPAN_ATTRIBUTE, decision.keep)
        if shipper is not None and event is not None:
            shipper.offer(event)  # the same kept records, to the user's log backend

    def observe_health(record: RequestRecord, _span: Span) -> None:
        if record.outcome.is_error and record.error_message and ENGINE_WATCH in app:
            app[ENGINE_WATCH].process.note_upstream_error_body(record.error_message)

    cold_starts = ColdStartTracker()
    registry.register(cold_starts)
    app[COLD_STARTS] = cold_starts

    def observe_cold_start(record: RequestRecord, _span: Span) -> None:
        """A successful first token ends a cold start (observers run at the end: step back to the token)."""
        if record.outcome is Outcome.OK and record.route in GENERATION_ROUTES and record.ttft_s is not None:
            cold_starts.first_token(at=time.monotonic() - ((record.e2e_s or 0.0) - record.ttft_s))

    ring = RequestRing(settings.serve.explain_ring_size)

    def observe_for_explain(record: RequestRecord, _span: Span) -> None:
        ring.add(record)  # a reference kept: explanations are computed when asked

    cutover = CutoverWatch(settings.serve, registry, lambda: app[SESSION])

    def observe_cutover(record: RequestRecord, span: Span) -> None:
        cutover.observe(record, span, generation=record.route in GENERATION_ROUTES)

    # the cut-over observer first: it puts the wrong-model reason and the tokenizer on the record the others see
    observers: list[Observer] = [observe_cutover, observe_metrics, observe_logs, observe_health, observe_cold_start,
                                 observe_for_explain]
    if settings.serve.genai_metrics:
        genai = app[GENAI] = GenAiServerMetrics(registry, *upstream_address(settings.serve.upstream),
                                                provider=provider_name(settings.serve.engine))

        def observe_genai(record: RequestRecord, _span: Span) -> None:
            genai.observe(record)

        observers.append(observe_genai)
    app[OBSERVERS] = observers

    def session() -> aiohttp.ClientSession:
        return app[SESSION]

    def degraded_models() -> frozenset[str]:
        runner = app.get(RULE_RUNNER)
        return runner.firing_label_values(DEGRADE_ALERT, "model_name") if runner is not None else frozenset()

    engine_stats = None
    if settings.serve.engine_stats_listen:
        engine_stats = app[ENGINE_STATS] = EngineStatsJoin(registry, settings.serve.engine_stats_wait_ms / 1000.0)
    usage = app[USAGE] = UsageAccounting(settings.cost, settings.serve.max_tenants, settings.serve.tenant_window_s,
                                         timeline=engine_stats.timeline if engine_stats is not None else None)
    registry.register(usage)

    def observe_usage(record: RequestRecord, _span: Span) -> None:
        usage.observe(record)  # tenant, cost pool, GPU-seconds, cost, repeats: exporters/usage.py

    observers.append(observe_usage)
    fast_retries = FastRetryCounter(registry, settings.serve.fast_retry_window_ms / 1000)
    observers.append(lambda record, _span: fast_retries.observe(record))  # same request again too soon

    proxy = _proxy(app, settings, observers, degraded_models, on_normalized=metrics.normalized.inc,
                   finish_with_engine_stats=engine_stats.finish if engine_stats is not None else None)
    if proxy.choice.shadow is not None:
        shadow = proxy.choice.shadow
        upstream_metrics.shadow_in_flight.set_function(lambda: shadow.in_flight)
    ready_gauge = metrics.upstream_ready.labels(settings.serve.upstream)

    def readiness_probed(ok: bool) -> None:
        """Every probe, the periodic one's and each /readyz call's, sets the gauge: it and the engine series'
        staleness (``Readiness.lost``) never disagree."""
        ready_gauge.set(1.0 if ok else 0.0)
        cold_starts.probe(ok)
        cutover.readiness(settings.serve.upstream, ok)  # a change to ready fingerprints the tokenizer again

    readiness = Readiness(settings.serve.upstream, settings.serve.readiness_path, session,
                          on_result=readiness_probed, details=cold_starts.details)
    detector = EngineDetector(settings.serve.engine, settings.serve.upstream,
                              on_known=partial(_engine_known, settings, readiness, app))
    app[READINESS] = readiness
    app[PROXY] = proxy

    app.cleanup_ctx.append(_client_session)
    def extra_upstream_probed(url: str, ok: bool) -> None:
        metrics.upstream_ready.labels(url).set(1.0 if ok else 0.0)
        cutover.readiness(url, ok)  # the long lane's, the canary's and the shadow's tokenizers too

    app.cleanup_ctx.append(_upstream_readiness(app, proxy, extra_upstream_probed))
    extras = ExtraUpstreams(extra_targets(proxy.choice), settings.scrape, session,
                            readiness_lost=lambda url: proxy.choice.ready.get(url) is False)
    app.cleanup_ctx.append(extras.ctx())  # after the probes: a first probe that failed makes the first scrape stale
    app.cleanup_ctx.append(_record_sink)
    if engine_stats is not None:  # after the sink: at shutdown, requests still waiting are finished into it
        app.cleanup_ctx.append(engine_stats_ctx(engine_stats, settings.serve.engine_stats_listen))
    app.cleanup_ctx.append(engine_detect_ctx(detector, registry, session, settings.scrape.interval_s))
    app.cleanup_ctx.append(_readiness_job)
    app.cleanup_ctx.append(engine_watch_ctx(
        settings, registry, session, app[INFLIGHT], readiness=lambda: readiness.last_ok,
        readiness_lost=lambda: readiness.lost,
        engine_step=engine_stats.current_step if engine_stats is not None else None,
        engine_steps=engine_stats.steps.since if engine_stats is not None else None,
        engine=lambda: detector.engine, on_exposition=detector.note_exposition,
    ))
    app.cleanup_ctx.append(ollama_watch_ctx(
        lambda: detector.engine == Engine.OLLAMA, settings.serve.upstream, session, registry,
        settings.scrape.interval_s, settings.scrape.timeout_s,
    ))
    app.cleanup_ctx.append(rule_engine_ctx(
        settings.rule_engine, lambda: rule_groups(settings.rules, tuple(settings.serve.length_bucket_edges)),
        registry, latest_vllm_text=lambda: app[ENGINE_WATCH].live_text() if ENGINE_WATCH in app else None,
        interval_s=settings.rules.evaluation_interval_s, annotate=with_slowest_request(ring),
        extra_sources=extras.store_sources(),  # the long lane's, canary's and shadow's engines, labelled
    ))
    if settings.serve.showback_schedule:
        app.cleanup_ctx.append(showback_schedule_ctx(settings.serve, settings.cost.currency, usage.ledger))
    app.on_cleanup.append(_shutdown_tracing)
    app.on_cleanup.append(lambda _app: cutover.close())

    app.router.add_get("/metrics", metrics_handler(registry))
    app.router.add_get(EXTRA_METRICS_PATH, extras.handle)  # the long lane's, canary's and shadow's engines
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readiness.handle)
    admin = admin_app(admin_token, proxy)

    def rule_engine_store() -> SeriesStore | None:
        runner = app.get(RULE_RUNNER)
        return runner.store if runner is not None else None

    add_explain_routes(admin, ring, ContextSources(
        steps=engine_stats.steps if engine_stats is not None else None, store=rule_engine_store,
        cold_starts=cold_starts,
        max_num_seqs=settings.rules.max_num_seqs, scrape_interval_s=settings.rules.evaluation_interval_s,
        readiness_interval_s=settings.serve.readiness_interval_s,
    ))
    add_shadow_routes(admin, ring)  # the shadowed requests for `inferwatch shadow report --sidecar`
    admin.router.add_get(USAGE_PATH, usage_handler(usage.ledger, settings.cost.currency))
    app.add_subapp(ADMIN_MOUNT, admin)
    if settings.serve.workers > 1:  # the primary of `serve --workers N`: the others' records come in here
        def finish_remote(record: RequestRecord, span: Span) -> None:
            if engine_stats is None:
                run_observers(observers, record, span)
            else:
                engine_stats.finish(record, lambda: run_observers(observers, record, span))

        intake = RecordIntake(finish_remote, app[INFLIGHT], app[IN_FLIGHT_REQUESTS], degraded_models, registry)
        app.router.add_post(RECORDS_PATH, intake.handle)
    app.router.add_route("*", "/v1/{tail:.*}", partial(aiohttp_handler, proxy.handle))
    app.router.add_route("*", "/api/{tail:.*}", partial(aiohttp_handler, proxy.handle))  # Ollama's native API
    return app


def _engine_known(settings: Settings, readiness: Readiness, app: web.Application, engine: Engine) -> None:
    """Once the engine is known: it is the requests' ``gen_ai.provider.name``; Ollama's readiness is its root
    endpoint (no /health), unless one was configured."""
    if PROXY in app:  # a configured engine is known before the proxy is registered: the proxy took it from config
        app[PROXY].provider_name = str(engine)
    if GENAI in app:
        app[GENAI].provider = str(engine)
    if engine == Engine.OLLAMA and settings.serve.readiness_path == DEFAULT_READINESS_PATH:
        readiness.url = settings.serve.upstream.rstrip("/") + "/"


def build_secondary_app(settings: Settings, primary_socket: str, worker: int, parent_pid: int) -> web.Application:
    """A secondary process of ``serve --workers N``: it proxies and sends its records to the primary.

    Raises:
        ConfigError: the HMAC key or the admin token cannot be read.
    """
    admin_token = load_admin_token(settings.serve.admin_token_file)
    app = web.Application(client_max_size=settings.serve.max_body_bytes, middlewares=[json_errors])
    app[SETTINGS] = settings
    app[TRACING] = Tracing(settings.tracing.service_name, settings.tracing.otlp_endpoint)
    app[INFLIGHT] = InFlightTokens()
    app[IN_FLIGHT_REQUESTS] = InFlightRequests()
    link = PrimaryLink(primary_socket)  # one client to the primary: records out, /metrics and admin reads in
    forwarder = RecordForwarder(link, worker, app[INFLIGHT], app[IN_FLIGHT_REQUESTS])
    # vLLM's numbers are joined in the primary: here the request only carries the id they are found by
    hook = (lambda _record, finish: finish()) if settings.serve.engine_stats_listen else None
    proxy = app[PROXY] = _proxy(app, settings, [forwarder.observe], lambda: forwarder.degraded,
                                on_normalized=None, finish_with_engine_stats=hook)

    async def background(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_learn_models_until_known(app[SESSION], settings, proxy))
        parent = asyncio.create_task(watch_parent(parent_pid, primary_socket))
        yield
        for running in (task, parent):
            running.cancel()

    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_upstream_readiness(app, proxy))
    app.cleanup_ctx.append(forwarder_ctx(forwarder))
    app.cleanup_ctx.append(background)
    app.on_cleanup.append(_shutdown_tracing)
    app.on_cleanup.append(link.close)  # after the cleanup contexts: the forwarder's last records went first
    primary = PrimaryForwarder(link)
    forward = primary.handle
    for path in FORWARDED_PATHS:
        app.router.add_get(path, forward)
    app.router.add_get("/healthz", healthz)
    admin = web.Application(middlewares=[admin_guard(admin_token)])  # checked here, answered there
    admin.router.add_get("/{tail:.*}", forward)
    app.add_subapp(ADMIN_MOUNT, admin)
    app.router.add_route("*", "/v1/{tail:.*}", partial(aiohttp_handler, proxy.handle))
    app.router.add_route("*", "/api/{tail:.*}", partial(aiohttp_handler, proxy.handle))  # Ollama's native API
    return app


def front_for(app: web.Application) -> Front:
    """The front serving ``app`` on the listen port: ``/v1/*`` to its proxy, the rest to aiohttp (serving/front.py)."""
    serve = app[SETTINGS].serve
    return Front(app[PROXY].handle, header_timeout_s=serve.client_header_timeout_s,
                 max_body_bytes=serve.max_body_bytes)


def _proxy(
    app: web.Application, settings: Settings, observers: list[Observer], degraded_models: Callable[[], frozenset[str]],
    *, on_normalized: Callable[[], None] | None, finish_with_engine_stats: FinishHook | None,
) -> Proxy:
    """The proxy with its admission checks; with ``serve --workers N`` each process admits its share."""
    serve = settings.serve
    if serve.workers > 1:
        serve = dataclasses.replace(serve, max_inflight=shares(serve.max_inflight, serve.workers))
    hmac_key = load_key(serve.hmac_key_file, serve.hmac_key_env)
    verifier = SignatureVerifier(hmac_key, serve.hmac_window_s) if hmac_key is not None else None
    admission = Admission(serve, degraded_models, verifier)

    def session() -> aiohttp.ClientSession:
        return app[SESSION]

    proxy = Proxy(serve, session, app[TRACING], observers, app[INFLIGHT], admission,
                  in_flight=app[IN_FLIGHT_REQUESTS], capture_prompt_hash=settings.logs.capture_prompt_hash,
                  on_normalized=on_normalized, finish_with_engine_stats=finish_with_engine_stats,
                  describe_request=request_describer(serve), tenancy=Tenancy(serve, settings.cost),
                  shadow=ShadowCopies(serve.shadow_upstream, serve.shadow_max_inflight, serve.shadow_timeout_s,
                                      session) if serve.shadow_upstream else None)

    async def close_upstream_connections(_app: web.Application) -> None:
        proxy.upstream_pool.close()

    app.on_cleanup.append(close_upstream_connections)
    return proxy


def _upstream_readiness(
    app: web.Application, proxy: Proxy, on_result: Callable[[str, bool], None] = lambda _url, _ok: None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Probes of the long lane, the canary and the shadow (after the client session exists): their readiness
    decides fallbacks and drops (serving/upstream_choice.py)."""
    serve = app[SETTINGS].serve
    return upstream_readiness_ctx(proxy.choice, lambda: app[SESSION], serve.readiness_path,
                                  serve.readiness_interval_s, on_result)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    """One pooled client session for every upstream call, shared by every client: so no cookie jar (an
    upstream's Set-Cookie goes to its client only, never into the next client's request)."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        app[SESSION] = session
        yield


async def _record_sink(app: web.Application) -> AsyncIterator[None]:
    """Start the log writer (and OTLP sender) threads; at shutdown flush them off the loop so kept
    records are not lost."""
    sink, shipper = app[SINK], app.get(SHIPPER)
    sink.start()
    if shipper is not None:
        shipper.start()
    yield
    loop = asyncio.get_running_loop()
    closing = [loop.run_in_executor(None, sink.close, 5.0)]
    if shipper is not None:
        closing.append(loop.run_in_executor(None, shipper.close, 5.0))
    await asyncio.gather(*closing)


async def _readiness_job(app: web.Application) -> AsyncIterator[None]:
    """Probe the upstream periodically so ``inferwatch_upstream_ready`` stays current (each probe sets it)."""
    settings, readiness, metrics = app[SETTINGS], app[READINESS], app[METRICS]
    for route in sorted(GENERATION_ROUTES):
        app[IN_FLIGHT_REQUESTS].precreate(("unknown", route))

    proxy = app[PROXY]
    learned = False

    async def probe() -> None:
        nonlocal learned
        ready = await readiness.probe()
        if ready and not learned:
            names = await _model_names(app[SESSION], settings)
            if names is not None:
                learned = True
                proxy.learn_models(names)
                for name in names:
                    for route in sorted(GENERATION_ROUTES):
                        for lane, role in proxy.choice.label_pairs:
                            metrics.precreate(name, route, tuple(settings.serve.length_bucket_edges), lane, role)
                        app[IN_FLIGHT_REQUESTS].precreate((name, route))

    jobs = PeriodicJobs()
    jobs.every(settings.serve.readiness_interval_s, probe, name="readiness")
    jobs.start()
    await probe()
    yield
    jobs.stop()


async def _model_names(session: aiohttp.ClientSession, settings: Settings) -> list[str] | None:
    """The model names the upstream serves (its /v1/models), or None when it cannot tell yet."""
    url = settings.serve.upstream.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            payload = await response.json(content_type=None)
        return [m["id"] for m in payload.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as err:
        log.warning("upstream_models_unreadable", url=url, error=repr(err))
        return None


async def _learn_models_until_known(session: aiohttp.ClientSession, settings: Settings, proxy: Proxy) -> None:
    """A secondary's model labels: ask the upstream until it answers (the primary's probe job does this)."""
    while (names := await _model_names(session, settings)) is None:  # noqa: ASYNC110 - the upstream is asked until it answers; no event to wait on
        await asyncio.sleep(settings.serve.readiness_interval_s)
    proxy.learn_models(names)


async def _shutdown_tracing(app: web.Application) -> None:
    app[TRACING].shutdown()
