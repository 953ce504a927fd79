"""Each line of the launch checklist, run against the target with the load-test, drill and warm-up code.

An item returns an :class:`~serving.prelaunch.checklist.Item`: ``pass`` or ``fail`` when it measured, ``manual``
when it needs something it was not given (a restart command, an expected load, a sidecar) and says what to
check by hand. Items run in the order of :data:`ORDER`; the ones that restart or kill the target come last.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from exporters.catalog.request import FAST_RETRIES, REQUESTS
from exporters.catalog.vllm import PREFIX_CACHE_QUERIES
from serving.loadtest.calibrate import calibrate, max_model_len
from serving.loadtest.capacity import DEFAULT_HEADROOM_PER_100_RPM, Provisioning
from serving.loadtest.coldstart import Restart, shell_restart, unexpected_failures
from serving.loadtest.drill import DrillSpec, find_process, kill_drill
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.run import default_source
from serving.loadtest.spec import LoadSpec, base_url
from serving.loadtest.stats import LoadReport
from serving.loadtest.steps import RunPlan, RunResult, run_steps
from serving.loadtest.warmup import WarmupSpec, warm_up
from serving.prelaunch import baseline as bl
from serving.prelaunch.checklist import Item
from serving.prelaunch.gpu_watch import GpuProfile, GpuWatch
from serving.prelaunch.jitter import JitterProxy
from serving.prelaunch.prefix import PrefixSource, prefix_phase
from serving.prelaunch.sidecar_metrics import read_samples, total

Say = Callable[[str], None]
PREFIX_ROOM = 32
"""Tokens left below the context for each request's own suffix."""


@dataclass(frozen=True, slots=True)
class PrelaunchSpec:
    """What to check and how hard (every count configurable, so a test can run the whole list in a minute)."""

    url: str
    model: str
    metrics_url: str = ""
    """The sidecar's /metrics (lanes, fast retries, GPU); default URL/metrics."""
    engine_metrics_url: str = ""
    """vLLM's own /metrics (prefix-cache counters, KV usage); default the metrics URL."""
    restart_cmd: str | None = None
    kill_match: str | None = None
    expected_rpm: float | None = None
    headroom_per_100_rpm: float = DEFAULT_HEADROOM_PER_100_RPM
    baseline: Path | None = None
    compare: Path | None = None
    limits: bl.Limits = field(default_factory=bl.Limits)
    mix: str = "512:7,8192:2,32768:1"
    mix_requests: int = 100
    concurrency: int = 4
    long_requests: int = 100
    cold_starts: int = 3
    cold_start_s: float = 60.0
    jitter_min_s: float = 0.3
    jitter_max_s: float = 5.0
    jitter_requests: int = 20
    jitter_timeout_s: float = 10.0
    prefix_requests: int = 1000
    prefix_tokens: int = 1024
    prefix_target: float = 0.85
    max_tokens: int = 16
    health_path: str = "/health"
    restart_timeout_s: float = 600.0
    kill_load_s: float = 5.0

    @property
    def sidecar_metrics(self) -> str:
        """The metrics URL actually read."""
        return self.metrics_url or base_url(self.url) + "/metrics"

    def load(self, **changes: Any) -> LoadSpec:
        """The base load spec of an item, with a seed of its own: one line's prompts never repeat another's, so the
        checklist's own traffic is no client's fast retry (the fast-retry line counts those)."""
        spec = LoadSpec(url=self.url, model=self.model, requests=self.mix_requests, concurrency=self.concurrency,
                        max_tokens=self.max_tokens, ignore_eos=True, timeout_s=120.0, seed=next(_LOAD_SEEDS))
        return replace(spec, **changes)


_LOAD_SEEDS = itertools.count(1)
"""Each item's load seed (seed 0 is the plain load test's)."""


@dataclass(slots=True)
class Context:
    """What earlier items leave for later ones: the mixed load's report and its GPUs, the fast-retry count at the
    start."""

    spec: PrelaunchSpec
    say: Say
    warnings: list[str] = field(default_factory=list)
    mix: LoadReport | None = None
    fast_retries_at_start: float = 0.0
    mix_gpu: GpuProfile | None = None


def _slowest(report: LoadReport) -> tuple[str, ...]:
    return tuple(s.trace_id for s in report.slowest if s.trace_id)


def _latency(report: LoadReport) -> dict[str, Any]:
    return {"requests": report.sent, "failed": report.failed, "errors": dict(report.errors), "wall_s": report.wall_s,
            "e2e_p50_s": report.e2e_s.p50, "e2e_p99_s": report.e2e_s.p99, "ttft_p99_s": report.ttft_s.p99,
            "requests_per_s": report.requests_per_s, "output_tokens_per_s": report.output_tokens_per_s}


async def _prepare(ctx: Context, options: LoadOptions) -> RunPlan:
    plan, calibration = await prepare(options, say=ctx.say)
    if calibration is not None:
        ctx.warnings.extend(w for w in calibration.warnings if w not in ctx.warnings)
    return plan


async def _run(ctx: Context, options: LoadOptions) -> RunResult:
    return await run_steps(await _prepare(ctx, options), say=ctx.say)


async def mix(ctx: Context) -> Item:
    """512/8k/32k at 7:2:1 (lengths above the context capped, with a warning); the sidecar's GPU readings during
    it are the baseline's power and temperature."""
    s = ctx.spec
    plan = await _prepare(ctx, LoadOptions(base=s.load(), concurrency=(s.concurrency,), mix=s.mix))
    async with aiohttp.ClientSession() as session, GpuWatch(session, s.sidecar_metrics) as watch:
        run = await run_steps(plan, say=ctx.say)
    ctx.mix_gpu = watch.profile()
    report = ctx.mix = run.steps[0]
    by_length: dict[str, list[int]] = {}
    for r in report.results:
        counts = by_length.setdefault(r.bucket or "?", [0, 0])
        counts[0] += 1
        counts[1] += 0 if r.ok else 1
    evidence = {**_latency(report), "mix": s.mix,
                "by_length": {k: f"{sent} sent, {bad} failed" for k, (sent, bad) in sorted(by_length.items())}}
    verdict = "fail" if report.failed else "pass"
    return Item("mix", "A 512/8k/32k mix at 7:2:1", verdict,
                f"{report.sent} requests, {report.failed} failed; p99 end-to-end {report.e2e_s.p99 or 0:.3g} s.",
                evidence, _slowest(report))


async def long_lane(ctx: Context) -> Item:
    """Prompts over 4,096 tokens in their own queue: the sidecar's requests by lane after the mix."""
    line = "Prompts over 4,096 tokens have their own processing queue"
    async with aiohttp.ClientSession() as session:
        found = await read_samples(session, ctx.spec.sidecar_metrics, REQUESTS.series)
    samples = (found or {}).get(REQUESTS.series)
    if not samples or not any("lane" in labels for labels, _ in samples):
        return Item("long_lane", line, "manual", "The target's /metrics has no requests by lane (not a sidecar with "
                    "lanes): check by hand that long prompts reach a replica of their own.",
                    {"metrics_url": ctx.spec.sidecar_metrics})
    lanes = {lane: total(samples, lane=lane) for lane in sorted({lb.get("lane", "") for lb, _ in samples})}
    long = lanes.get("long", 0.0)
    finding = (f"{long:g} requests went to the long lane." if long else
               "No request went to a long lane: long prompts share the default queue (set "
               "serve.long_prompt_upstream on the sidecar).")
    return Item("long_lane", line, "pass" if long else "fail", finding, {"requests_by_lane": lanes})


async def long_context(ctx: Context) -> Item:
    """``long_requests`` consecutive requests at the model's maximum context."""
    s = ctx.spec
    run = await _run(ctx, LoadOptions(base=s.load(requests=s.long_requests, concurrency=None),
                                      preset="long-context"))
    report = run.steps[0]
    rate = report.failed / report.sent if report.sent else 0.0
    return Item("long_context", f"{s.long_requests} consecutive requests at the maximum context",
                "fail" if report.failed else "pass",
                f"{report.sent} requests at the model's maximum context, failure rate {rate:.1%}.",
                {**_latency(report), "failure_rate": rate}, _slowest(report))


async def jitter(ctx: Context) -> Item:
    """Network jitter: the load through a proxy delaying each request, with the client's timeout and backoff."""
    s = ctx.spec
    line = f"Network jitter of {s.jitter_min_s * 1000:g} ms-{s.jitter_max_s:g} s"
    async with JitterProxy(s.url, s.jitter_min_s, s.jitter_max_s) as proxy:
        spec = s.load(url=proxy.url, requests=s.jitter_requests, concurrency=2, timeout_s=s.jitter_timeout_s,
                      prompt_tokens=32)
        run = await run_steps(_plan(spec), say=ctx.say)
        delays = sorted(proxy.delays_s)
    report = run.steps[0]
    timeouts = sum(n for kind, n in report.errors.items() if "timeout" in kind.lower())
    evidence = {**_latency(report), "client_timeout_s": s.jitter_timeout_s, "timeouts": timeouts,
                "retries": report.retries, "backoff_s": report.backoff_s,
                "delay_s": {"min": delays[0] if delays else None,
                            "median": statistics.median(delays) if delays else None,
                            "max": delays[-1] if delays else None}}
    finding = (f"{report.sent} requests through {len(delays)} delays: {timeouts} timed out after "
               f"{s.jitter_timeout_s:g} s, {report.retries} were retries after a failure, backing off "
               f"{report.backoff_s:.1f} s in all; {report.failed} failed.")
    return Item("jitter", line, "fail" if report.failed else "pass", finding, evidence, _slowest(report))


def _plan(spec: LoadSpec) -> RunPlan:
    validated = spec.validate()
    return RunPlan((validated,), (validated.pace,), default_source(validated))


async def fast_retries(ctx: Context) -> Item:
    """Retries no sooner than 500 ms: the sidecar's count of fast retries during the checklist."""
    line = "Retries no sooner than 500 ms, with backoff"
    async with aiohttp.ClientSession() as session:
        found = await read_samples(session, ctx.spec.sidecar_metrics, FAST_RETRIES.series, REQUESTS.series)
    if found is None or REQUESTS.series not in found:  # the counter shows no sample before its first count
        return Item("fast_retries", line, "manual", "The target's /metrics has no fast-retry count (not an inferwatch "
                    "sidecar): check the clients' retry settings by hand (first retry after 500 ms or more, doubling).",
                    {"metrics_url": ctx.spec.sidecar_metrics})
    counted = total(found.get(FAST_RETRIES.series)) - ctx.fast_retries_at_start
    finding = (f"The sidecar counted {counted:g} requests sent again by the same client within its window "
               f"(serve.fast_retry_window_ms) during the checklist." if counted else
               "No client sent the same request again within the window during the checklist.")
    return Item("fast_retries", line, "fail" if counted else "pass", finding,
                {"fast_retries": counted, "metric": FAST_RETRIES.series})


async def shared_prefix(ctx: Context) -> Item:
    """``prefix_requests`` requests sharing a long prefix: vLLM's prefix-cache hit ratio against the target, with
    KV usage and TTFT against the same load with distinct prefixes."""
    s = ctx.spec
    line = f"{s.prefix_requests} requests sharing a prefix reuse the prefix cache ({s.prefix_target:.0%})"
    async with aiohttp.ClientSession() as session:
        context = await max_model_len(session, s.url, s.model)
        goal = s.prefix_tokens
        if context is not None and goal > context - s.max_tokens - PREFIX_ROOM:
            goal = context - s.max_tokens - PREFIX_ROOM
            ctx.warnings.append(f"shared prefix of {s.prefix_tokens} tokens capped to {goal}: the model's context is "
                                f"{context} tokens")
        calibration = await calibrate(session, s.url, s.model, [goal], chat=False, max_tokens=s.max_tokens,
                                      say=ctx.say)
    words = calibration.lengths[0].words
    load = s.load(requests=s.prefix_requests)
    metrics = s.engine_metrics_url or s.sidecar_metrics
    shared = await prefix_phase(load, PrefixSource(words, True, s.max_tokens), metrics)
    distinct = await prefix_phase(load, PrefixSource(words, False, s.max_tokens), metrics)
    evidence = {"prefix_tokens": calibration.lengths[0].tokens, "engine_metrics_url": metrics,
                "shared": shared.to_dict(), "distinct": distinct.to_dict()}
    ratio = shared.hit_ratio
    if ratio is None:
        return Item("shared_prefix", line, "manual", f"{metrics} gives no prefix-cache counters (vLLM's "
                    f"{PREFIX_CACHE_QUERIES.name}): point --engine-metrics-url at vLLM's /metrics.", evidence)
    finding = (f"Prefix-cache hit ratio {ratio:.1%} with a shared prefix (target {s.prefix_target:.0%}) against "
               f"{distinct.hit_ratio or 0:.1%} without; TTFT p50 {shared.report.ttft_s.p50 or 0:.3g} s against "
               f"{distinct.report.ttft_s.p50 or 0:.3g} s; peak KV usage {shared.kv_usage_max or 0:.1%} against "
               f"{distinct.kv_usage_max or 0:.1%}.")
    failed = shared.report.failed + distinct.report.failed
    verdict = "pass" if ratio >= s.prefix_target and not failed else "fail"
    return Item("shared_prefix", line, verdict, finding, evidence)


async def capacity(ctx: Context) -> Item:
    """The capacity model: the mix's throughput against the expected load plus headroom per 100 rpm."""
    s = ctx.spec
    line = f"Capacity for the expected load with {s.headroom_per_100_rpm:.0%} headroom per 100 rpm"
    if s.expected_rpm is None or ctx.mix is None:
        return Item("capacity", line, "manual", "Give --expected-rpm N to model the capacity: replicas for the "
                    "expected load plus headroom, from the mix's measured throughput.", {})
    model = Provisioning(s.expected_rpm, s.headroom_per_100_rpm, ctx.mix.requests_per_s * 60)
    enough = model.capacity_rpm >= model.needed_rpm
    finding = (f"This deployment served {model.capacity_rpm:.0f} rpm of the mix; {s.expected_rpm:g} rpm plus "
               f"{model.headroom_ratio:.0%} headroom needs {model.needed_rpm:.0f} rpm: {model.replicas} "
               f"replica(s) like this one.")
    return Item("capacity", line, "pass" if enough else "fail", finding, model.to_dict())


def _profile(ctx: Context, report: LoadReport, gpu: GpuProfile) -> dict[str, Any]:
    """The mix's latency and throughput, its GPUs' power and temperature, and tokens per joule: the output tokens
    per second the client received over the mean power."""
    tokens_per_joule = report.output_tokens_per_s / gpu.power_watts if gpu.power_watts else None
    return {**_latency(report), **gpu.to_dict(), "tokens_per_joule": tokens_per_joule, "url": ctx.spec.url,
            "model": ctx.spec.model, "saved_unix": time.time()}


async def baseline(ctx: Context) -> Item:
    """The baseline profile of the mix: saved with --baseline, compared with --compare; without power or
    temperature the line is manual, naming what is missing."""
    s = ctx.spec
    line = "A baseline profile with temperature and power"
    if ctx.mix is None or ctx.mix_gpu is None:
        return Item("baseline", line, "manual", "No mixed load ran, so there is no profile.", {})
    gpu = ctx.mix_gpu
    profile = _profile(ctx, ctx.mix, gpu)
    missing = "; ".join(gpu.missing)
    if s.compare is not None:
        before = bl.load(s.compare)
        found, skipped = bl.regressions(before, profile, s.limits), bl.uncompared(before, profile)
        lim = s.limits
        finding = ("Against the baseline: " + "; ".join(found) + "." if found else
                   f"No regression against {s.compare} (p99 +{lim.p99_rise:.0%}, throughput "
                   f"-{lim.throughput_drop:.0%}, power +{lim.power_rise:.0%}, tokens per joule "
                   f"-{lim.tokens_per_joule_drop:.0%}, temperature +{lim.temperature_rise_c:g} °C allowed).")
        if skipped:
            finding += f" Not compared: {', '.join(skipped)}" + (f" ({missing})." if missing else ".")
        return Item("baseline", "No regression against the baseline", "fail" if found else "pass", finding,
                    {"baseline": str(s.compare), "now": profile, "regressions": found, "not_compared": skipped})
    if s.baseline is None:
        return Item("baseline", line, "manual", "Give --baseline FILE to save this profile, --compare FILE to "
                    "compare against one.", profile)
    bl.save(s.baseline, profile)
    if missing:
        return Item("baseline", line, "manual", f"Profile saved to {s.baseline} without power or temperature: "
                    f"{missing}. Record them by hand during a load (nvidia-smi --query-gpu=power.draw,"
                    "temperature.gpu --format=csv -l 1).", {**profile, "missing": list(gpu.missing)})
    tokens_per_joule = profile["tokens_per_joule"]
    return Item("baseline", line, "pass", f"Profile saved to {s.baseline}: {gpu.power_watts:.4g} W on average "
                f"over {gpu.gpus} GPU(s) during the mix (peak {gpu.power_watts_max:.4g} W), hottest GPU "
                f"{gpu.temperature_celsius_max:.4g} °C, "
                f"{'no' if tokens_per_joule is None else f'{tokens_per_joule:.4g}'} tokens per joule.", profile)


async def cold_starts(ctx: Context) -> Item:
    """At least three cold-start shocks in a mixed load (the restart command restarts the target)."""
    s = ctx.spec
    line = f"{s.cold_starts} cold-start shocks in a mixed load"
    if not s.restart_cmd:
        return Item("cold_starts", line, "manual", "Give --restart-cmd CMD (restarts the engine) to measure "
                    "restart -> ready -> first token under load.", {})
    restart = shell_restart(s.restart_cmd, timeout_s=s.restart_timeout_s)
    run = await _run(ctx, LoadOptions(base=s.load(requests=None, duration_s=s.cold_start_s), mix=s.mix,
                                      concurrency=(s.concurrency,), cold_starts=s.cold_starts, restart=restart,
                                      health_path=s.health_path, ready_deadline_s=s.restart_timeout_s))
    events = [e.to_dict() for e in run.cold_starts]
    bad = [e for e in run.cold_starts if e.error]
    unexpected = unexpected_failures(run.results, run.cold_starts)
    finding = (f"{len(run.cold_starts)} restarts: {len(bad)} did not come back"
               + (f" ({bad[0].error})" if bad else "") + f"; {len(unexpected)} requests failed outside a restart.")
    return Item("cold_starts", line, "fail" if bad or unexpected or len(run.cold_starts) < s.cold_starts else "pass",
                finding, {"restarts": events, "unexpected_failures": len(unexpected)})


async def kill_9(ctx: Context) -> Item:
    """kill -9 of the serving process under load, then the restart command; recovered when it answers again."""
    s = ctx.spec
    line = "Recovery from kill -9"
    if not s.kill_match or not s.restart_cmd:
        return Item("kill_9", line, "manual", "Give --kill-match PATTERN (the process to SIGKILL) and --restart-cmd "
                    "CMD to drill it.", {})
    process = find_process(None, s.kill_match)
    restart: Restart = shell_restart(s.restart_cmd, timeout_s=s.restart_timeout_s)
    drill = DrillSpec(s.url, s.model, restart, None, s.health_path, concurrency=2, max_tokens=s.max_tokens,
                      before_s=s.kill_load_s, after_s=s.kill_load_s, ready_deadline_s=s.restart_timeout_s)
    result = await kill_drill(drill, process, say=ctx.say)
    recovery = result.recovery
    after = recovery.first_token_s if recovery is not None else None
    finding = (f"pid {result.pid} killed; answering again after {after:.1f} s." if result.recovered and after else
               f"pid {result.pid} killed; not back: {recovery.error if recovery else 'no recovery measured'}.")
    return Item("kill_9", line, "pass" if result.recovered else "fail", finding, result.to_dict())


async def warm(ctx: Context) -> None:
    """Before the items: wait for the target and let its TTFT settle, so the first item measures a warm server."""
    s = ctx.spec
    result = await warm_up(WarmupSpec(url=s.url, model=s.model, max_requests=20, timeout_s=120.0,
                                      health_path=s.health_path).validate(), on_step=ctx.say)
    if not result.settled:
        ctx.warnings.append(f"warm-up: TTFT did not settle ({result.reason})")
    async with aiohttp.ClientSession() as session:
        found = await read_samples(session, s.sidecar_metrics, FAST_RETRIES.series)
    ctx.fast_retries_at_start = total((found or {}).get(FAST_RETRIES.series))


ItemRun = Callable[[Context], Awaitable[Item]]
ORDER: tuple[ItemRun, ...] = (mix, long_lane, long_context, jitter, shared_prefix, capacity, baseline, fast_retries,
                              cold_starts, kill_9)
"""The checklist in the order it runs: loads first, the fast-retry count after them, restarts and the kill last."""

__all__ = ["ORDER", "Context", "ItemRun", "PrelaunchSpec", "Say", "warm"]
