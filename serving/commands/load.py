"""`inferwatch loadtest` and `inferwatch warmup`: measure a vLLM deployment, or warm a cold one."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from exporters.errors import ConfigError
from serving.config import settings_from_args
from serving.loadtest.backoff import INITIAL_MS, MAX_MS
from serving.loadtest.calibrate import Calibration
from serving.loadtest.capacity import DEFAULT_HEADROOM_PER_100_RPM, SloTarget
from serving.loadtest.coldstart import shell_restart, unexpected_failures
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.progress import ProgressPrinter
from serving.loadtest.ramp import RampResult, RampSpec, ramp_up
from serving.loadtest.run import OnProgress
from serving.loadtest.spec import ARRIVALS, LoadSpec, base_url
from serving.loadtest.steps import RunResult, run_steps
from serving.loadtest.table import format_run
from serving.loadtest.warmup import WarmupSpec, check_health_path, wait_healthy, warm_up

DEFAULT_REQUESTS = 100
DEFAULT_CONCURRENCY = 8
SLO_SHORTCUTS = {"slo_latency_s": "rules.slo_latency_threshold_s", "slo_objective": "rules.slo_objective"}
LOADTEST_STARTERS = ("--url", "--model", "--requests", "--duration", "--concurrency", "--rate", "--mix", "--report",
                     "--json")
"""The flags the usage line of ``loadtest`` shows; --help lists every one, by group."""
WARMUP_STARTERS = ("--url", "--model", "--to-rps", "--json")
"""The flags the usage line of ``warmup`` shows (and the required ones)."""

LOADTEST_HELP = """Send a bounded load (--requests N, --duration S, or both: whichever ends first) to an
OpenAI-compatible server, vLLM directly or through `inferwatch serve`, and report what the client saw:
p50/p90/p99 of time to first token (streamed only), inter-token gaps and end-to-end latency,
requests/s, output tokens/s (from usage), errors by status, and the trace ids of the slowest
requests (returned by the sidecar in x-trace-id: `inferwatch explain ID` finds each one while the
sidecar holds it among its newest requests, its span is in the sidecar's trace backend, and
`inferwatch logs search` finds its record only if the archive kept it, as it keeps errors, requests
over their SLA and logs.success_sample_ratio of the rest).
Load is either --concurrency C workers, each sending its next request when the last one ends
(after a failed one, backing off exponentially from --retry-initial-ms with jitter; those count as retries),
or --rate R requests/s started on a schedule whatever the latency (request i at i/R s, or
Poisson arrivals with --arrivals poisson). A list (--concurrency 1,2,4,8) runs one step per
value, each bounded by --step-duration and/or --requests.
Without either, --concurrency 8; without --requests or --duration, --requests 100.

What is sent: PROMPT-TOKENS words (default), a mix of prompt lengths in the target's own tokens
(--mix 512:7,8192:2,32768:1, calibrated with vLLM's /tokenize or, without it, the usage of one-token
requests; lengths above the model's context are capped with a warning), prompts from a JSONL
file (--prompts), the shape of archived traffic (--replay DIR: the sidecar's request-log archive,
arrival times, models and lengths; prompts generated at those lengths), or --preset long-context
(100 consecutive requests at the model's maximum context, failure rate reported on its own).

--report DIR writes report.md, report.json (every number and the raw samples) and PNG plots,
scraping the target's /metrics (or --metrics-url) every --scrape-interval seconds for the queue,
the batch, KV usage, preemptions and, through a sidecar with NVML, GPU power and temperature.
Goodput, capacity (the last step before the first that misses the SLO) and --expected-rpm
provisioning use the SLO of the rules config (--config, --slo-latency-s, --slo-objective).
--cold-starts N --restart-cmd CMD restarts the upstream N times, spread over the run, and
reports restart -> ready -> first token and the p99 latency before and after each.
Progress goes to stderr: a bar on a terminal, a line a second otherwise; the table (or --json) to
stdout. Exit 1 when any request failed (outside a planned restart) or a restart did not recover."""
WARMUP_HELP = """Two ways to warm a server that just started.

Settle (default): wait until GET URL+--health-path answers 200, then send small streamed
requests one at a time until the last --window TTFTs all lie within --settle-ratio of their
median, or within --settle-floor-ms of it when that is larger (the server has compiled its
kernels and filled its caches), or the budget (--max-requests, --timeout) runs out.
Exit 0 when TTFT settled, 1 when not (with the reason). Against the sidecar use --health-path /readyz.

Ramp (--to-rps R): after the health wait, real requests of realistic lengths (--mix or --prompts;
health pings compile nothing) at a rate rising linearly from --from-rps to --to-rps over --over
seconds, then held at R for --hold seconds. Reports when latency settled (windows of --window-s
whose median TTFT stays within --settle-ratio of the last one's) and exits 1 when the SLO of the
rules config (--config, --slo-latency-s, --slo-objective) is not met while held at R."""


def _numbers(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> tuple[int | float, ...]:
        try:
            values = tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values

    return parse


def _add_target(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    parser.add_argument("--url", required=True, metavar="URL",
                        help="Base URL of vLLM or the sidecar, e.g. http://127.0.0.1:9100 (a trailing /v1 is fine).")
    parser.add_argument("--model", required=model_required, default="", metavar="M",
                        help="The served model name." + ("" if model_required else
                                                          " With --replay, replaces the archived models."))
    parser.add_argument("--chat", action="store_true", help="Use /v1/chat/completions instead of /v1/completions.")


def _add_slo(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the SLO (from the rules config)")
    group.add_argument("--config", metavar="FILE", help="TOML configuration file: [rules] slo_latency_threshold_s "
                       "and slo_objective.")
    group.add_argument("--slo-latency-s", type=float, metavar="S",
                       help="A good request succeeds within S seconds (rules.slo_latency_threshold_s; a latency "
                       "bucket bound, default 10).")
    group.add_argument("--slo-objective", type=float, metavar="F",
                       help="Share of good requests a step must reach (rules.slo_objective, default 0.999).")


def _add_profile(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    what = parser.add_argument_group("what to send (one of --mix, --prompts, --replay, --preset)")
    what.add_argument("--prompt-tokens", type=int, default=32, metavar="P",
                      help="Prompt length in words, about one token each (default 32; usage gives the real count).")
    what.add_argument("--mix", metavar="LEN:W,...",
                      help="Prompt lengths in tokens with weights, e.g. 512:7,8192:2,32768:1 (calibrated).")
    what.add_argument("--prompts", metavar="FILE",
                      help="JSONL: per line a string, {\"prompt\": ...} or {\"messages\": [...]} (+ max_tokens).")
    what.add_argument("--seed", type=int, default=0, help="Seed of the mix draw and of Poisson arrivals (default 0).")
    return what


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `loadtest` and `warmup` commands."""
    raw = argparse.RawDescriptionHelpFormatter
    loadtest = subparsers.add_parser("loadtest", help="Measure a vLLM server (or the sidecar) under a bounded load.",
                                     description=LOADTEST_HELP, formatter_class=raw, usage_flags=LOADTEST_STARTERS)
    _add_target(loadtest, model_required=False)
    amount = loadtest.add_argument_group("how much, per step (at least one is used; both: whichever ends first)")
    amount.add_argument("--requests", type=int, metavar="N", help=f"Requests to send (default {DEFAULT_REQUESTS}).")
    amount.add_argument("--duration", "--step-duration", dest="duration", type=float, metavar="S",
                        help="Seconds to keep starting requests.")
    how_fast = loadtest.add_argument_group("how fast (closed loop --concurrency, or open loop --rate)")
    pace = how_fast.add_mutually_exclusive_group()
    pace.add_argument("--concurrency", type=_numbers(int), metavar="C[,C...]",
                      help=f"Requests in flight at all times, closed loop (default {DEFAULT_CONCURRENCY}); "
                      "a list runs one step each.")
    pace.add_argument("--rate", type=_numbers(float), metavar="R[,R...]",
                      help="Requests started per second, open loop; a list runs one step each.")
    how_fast.add_argument("--arrivals", choices=ARRIVALS[:2], default="fixed",
                          help="Open-loop schedule: fixed (request i at i/R s, default) or poisson.")
    how_fast.add_argument("--max-in-flight", type=int, default=256, metavar="N",
                          help="With --rate: most requests in flight; later ones wait and count as late "
                          "(default 256).")
    what = _add_profile(loadtest)
    what.add_argument("--replay", metavar="DIR",
                      help="Replay the traffic of the sidecar's request-log archive in DIR (it holds what "
                      "[logs] sampling kept).")
    what.add_argument("--replay-speed", type=float, default=1.0, metavar="X",
                      help="Replay X times faster than recorded (default 1).")
    what.add_argument("--preset", choices=("long-context",),
                      help="long-context: --requests (default 100) consecutive requests at the model's "
                      "maximum context.")
    each = loadtest.add_argument_group("each request")
    each.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                      help="Stream the answers (TTFT and inter-token gaps are measured only when streamed).")
    each.add_argument("--max-tokens", type=int, default=64, metavar="T",
                      help="max_tokens per request (default 64).")
    each.add_argument("--ignore-eos", action="store_true",
                      help="Ask vLLM to generate exactly max_tokens (ignore_eos, a vLLM extension).")
    each.add_argument("--timeout", type=float, default=60.0, metavar="S",
                      help="Seconds one request may take in all (default 60).")
    retry = loadtest.add_argument_group("after a failed request (closed loop; an open loop keeps its schedule)")
    retry.add_argument("--retry-initial-ms", type=float, default=INITIAL_MS, metavar="MS",
                       help="A worker waits MS after a failed request before its next one, doubling with each "
                       "failure in a row, plus up to 50 %% jitter, and at least the answer's Retry-After "
                       "(default 500).")
    retry.add_argument("--retry-max-ms", type=float, default=MAX_MS, metavar="MS",
                       help="The doubling stops at MS (plus jitter) (default 5000).")
    report = loadtest.add_argument_group("the report")
    report.add_argument("--report", metavar="DIR", help="Write report.md, report.json and PNG plots into DIR.")
    report.add_argument("--metrics-url", metavar="URL",
                        help="Scraped during a --report run (default: the target's /metrics; 'none' to skip).")
    report.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                        help="Seconds between scrapes (default 1).")
    report.add_argument("--expected-rpm", type=float, metavar="RPM",
                        help="Expected load in requests/min, for the provisioning advice.")
    report.add_argument("--headroom-per-100-rpm", type=float, default=DEFAULT_HEADROOM_PER_100_RPM, metavar="F",
                        help="Spare capacity kept per 100 requests/min of expected load (default 0.10).")
    _add_slo(loadtest)
    cold = loadtest.add_argument_group("cold starts")
    cold.add_argument("--cold-starts", type=int, default=0, metavar="N",
                      help="Restart the upstream N times, spread over the run (needs --step-duration).")
    cold.add_argument("--restart-cmd", metavar="CMD", help="Shell command that restarts the upstream.")
    cold.add_argument("--health-path", default="/health", metavar="PATH",
                      help="Readiness path polled after a restart (default /health; /readyz on the sidecar).")
    cold.add_argument("--restart-timeout", type=float, default=600.0, metavar="S",
                      help="Seconds a restart may take until ready (default 600).")
    cold.add_argument("--shock-window", type=float, default=60.0, metavar="S",
                      help="p99 latency is compared over S seconds before the restart and after ready (default 60).")
    loadtest.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")
    loadtest.add_argument("--quiet", action="store_true", help="No progress on stderr.")
    loadtest.set_defaults(func=run_loadtest)

    warmup = subparsers.add_parser("warmup", help="Warm a cold vLLM server until its TTFT has settled.",
                                   description=WARMUP_HELP, formatter_class=raw, usage_flags=WARMUP_STARTERS)
    _add_target(warmup)
    warmup.add_argument("--max-requests", type=int, default=50, metavar="N",
                        help="Settle: most warm-up requests to send (default 50).")
    warmup.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="Seconds in all for the settle warm-up, health wait included; with --to-rps, the "
                        "health wait only (default 300).")
    warmup.add_argument("--settle-ratio", type=float, default=0.2, metavar="F",
                        help="Settled when the last --window TTFTs are within F of their median (default 0.2).")
    warmup.add_argument("--settle-floor-ms", type=float, default=20.0, metavar="MS",
                        help="...or within MS milliseconds, whichever is larger, so that scheduling jitter on a "
                        "fast server is not mistaken for a cold one (default 20).")
    warmup.add_argument("--window", type=int, default=5, metavar="K", help="TTFTs judged together (default 5).")
    warmup.add_argument("--health-path", default="/health", metavar="PATH",
                        help="Readiness path (default /health, vLLM's; /readyz on the sidecar).")
    warmup.add_argument("--max-tokens", type=int, default=4, metavar="T", help="max_tokens per request (default 4).")
    ramp = warmup.add_argument_group("ramp (with --to-rps)")
    ramp.add_argument("--from-rps", type=float, default=1.0, metavar="R", help="Starting rate (default 1).")
    ramp.add_argument("--to-rps", type=float, metavar="R", help="Target rate: ramp instead of settle.")
    ramp.add_argument("--over", type=float, default=60.0, metavar="S", help="Seconds of the ramp (default 60).")
    ramp.add_argument("--hold", type=float, default=30.0, metavar="S",
                      help="Seconds held at the target rate, over which the SLO is judged (default 30).")
    ramp.add_argument("--window-s", type=float, default=5.0, metavar="S",
                      help="Seconds per window when judging settling (default 5).")
    _add_profile(warmup)
    _add_slo(warmup)
    warmup.add_argument("--json", action="store_true", help="Print one JSON object at the end instead of lines.")
    warmup.set_defaults(func=run_warmup)


def slo_target(args: argparse.Namespace) -> SloTarget:
    """The SLO of the rules config (--config), with --slo-latency-s and --slo-objective on top."""
    return SloTarget.from_rules(settings_from_args(args, SLO_SHORTCUTS).rules)


def base_spec(args: argparse.Namespace, *, bounded: bool) -> LoadSpec:
    """The spec every step starts from (not validated: the steps are)."""
    requests = args.requests
    if bounded and requests is None and args.duration is None:
        requests = DEFAULT_REQUESTS
    concurrency = None
    if not args.concurrency and not args.rate:
        concurrency = DEFAULT_CONCURRENCY
    return LoadSpec(
        url=args.url, model=args.model, requests=requests, duration_s=args.duration, concurrency=concurrency,
        rate=None, stream=args.stream, chat=args.chat, prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, timeout_s=args.timeout,
        max_in_flight=args.max_in_flight, arrivals=args.arrivals, seed=args.seed,
        retry_initial_ms=args.retry_initial_ms, retry_max_ms=args.retry_max_ms,
    )


def run_loadtest(args: argparse.Namespace) -> int:
    """Run `inferwatch loadtest`; exit 1 when a request failed (outside a planned restart) or a restart failed."""
    if args.report:
        _require_plots()
    metrics_url = args.metrics_url or (args.url.rstrip("/").removesuffix("/v1") + "/metrics")
    restart = shell_restart(args.restart_cmd, timeout_s=args.restart_timeout) if args.restart_cmd else None
    options = LoadOptions(
        base=base_spec(args, bounded=not args.replay), concurrency=args.concurrency or (), rate=args.rate or (),
        mix=args.mix, prompts=args.prompts, replay=args.replay, replay_speed=args.replay_speed, preset=args.preset,
        metrics_url=None if not args.report or metrics_url == "none" else metrics_url,
        scrape_interval_s=args.scrape_interval, cold_starts=args.cold_starts, restart=restart,
        health_path=args.health_path, ready_deadline_s=args.restart_timeout, shock_window_s=args.shock_window,
    )
    slo = slo_target(args)
    printer = ProgressPrinter()
    quiet = args.quiet

    def say(line: str) -> None:
        if not quiet:
            printer.say(line)

    run, calibration = asyncio.run(_loadtest(options, None if quiet else printer, say))
    printer.end()
    document = None
    if args.report:
        from serving.loadtest.report import ReportContext, build_document, write_report

        given = {k: v for k, v in vars(args).items() if k != "func" and not k.startswith("cfg:")}
        context = ReportContext(slo, args.expected_rpm, args.headroom_per_100_rpm, calibration,
                                tuple(calibration.warnings) if calibration else (), given)
        document = build_document(run, context)
        written = write_report(Path(args.report), document)
        say(f"report written: {', '.join(str(p) for p in written)}")
    unexpected = unexpected_failures(run.results, run.cold_starts)
    if args.json:
        print(json.dumps(_json_of(run, document)))
    else:
        print(format_run(run))
    return 1 if unexpected or any(e.error for e in run.cold_starts) else 0


def _require_plots() -> None:
    try:
        import matplotlib  # noqa: F401 - only checking that the plotting extra is installed
    except ImportError:
        raise ConfigError("--report", "the plots need matplotlib: pip install '.[report]' in the checkout") from None


async def _loadtest(
    options: LoadOptions, printer: OnProgress | None, say: Callable[[str], None]
) -> tuple[RunResult, Calibration | None]:
    plan, calibration = await prepare(options, say=say)
    return await run_steps(plan, on_progress=printer, say=say), calibration


def _json_of(run: RunResult, document: dict[str, Any] | None) -> dict[str, Any]:
    if document is not None:
        return {k: v for k, v in document.items() if k != "samples"}
    if len(run.steps) == 1:
        return {**run.steps[0].to_dict(), "cold_starts": [e.to_dict() for e in run.cold_starts]}
    return {"steps": [{"label": label, **step.to_dict()} for label, step in zip(run.plan.labels, run.steps,
                                                                                   strict=True)],
            "cold_starts": [e.to_dict() for e in run.cold_starts]}


def warmup_spec(args: argparse.Namespace) -> WarmupSpec:
    """The validated warm-up spec of parsed `warmup` arguments."""
    return WarmupSpec(url=args.url, model=args.model, max_requests=args.max_requests, timeout_s=args.timeout,
                      settle_ratio=args.settle_ratio, settle_floor_s=args.settle_floor_ms / 1000,
                      window=args.window, health_path=args.health_path, chat=args.chat,
                      max_tokens=args.max_tokens).validate()


def run_warmup(args: argparse.Namespace) -> int:
    """Run `inferwatch warmup`; exit 0 when TTFT settled (or the SLO held at the target rate), 1 when not."""
    if args.to_rps is not None:
        return _run_ramp(args)
    spec = warmup_spec(args)

    def step(line: str) -> None:
        print(f"warmup: {line}", flush=True)

    result = asyncio.run(warm_up(spec, on_step=None if args.json else step))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        verdict = "settled" if result.settled else "NOT settled"
        print(f"warmup: {verdict} in {result.elapsed_s:.1f} s: {result.reason}")
    return 0 if result.settled else 1


def _run_ramp(args: argparse.Namespace) -> int:
    ramp = RampSpec(args.from_rps, args.to_rps, args.over, args.hold, args.window_s, args.settle_ratio,
                    args.settle_floor_ms / 1000).validate()
    check_health_path(args.health_path)
    load = LoadSpec(url=args.url, model=args.model, requests=1, rate=args.to_rps, chat=args.chat,
                    prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, ignore_eos=True,
                    seed=args.seed).validate()
    target = slo_target(args)

    def say(line: str) -> None:
        if not args.json:
            print(f"warmup: {line}", flush=True)

    result = asyncio.run(_ramp(args, load, ramp, target, say))
    if result is None:
        return 1
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        settled = "never settled" if result.settled_at_s is None else f"settled {result.settled_at_s:g} s in"
        verdict = result.at_target
        print(f"warmup: latency {settled}; at {args.to_rps:g} req/s {verdict.sent} requests, goodput "
              f"{(verdict.goodput or 0.0):.1%} (SLO {target.objective:.2%} within {target.latency_s:g} s): "
              f"{'met' if verdict.meets_slo else 'NOT met'}")
    return 0 if result.at_target.meets_slo else 1


async def _ramp(
    args: argparse.Namespace, load: LoadSpec, ramp: RampSpec, target: SloTarget, say: Callable[[str], None]
) -> RampResult | None:
    async with aiohttp.ClientSession() as session:
        healthy, last = await wait_healthy(session, base_url(args.url) + args.health_path,
                                           deadline=time.monotonic() + args.timeout, poll_s=0.5,
                                           clock=time.monotonic, sleep=asyncio.sleep)
    if not healthy:
        say(f"GET {base_url(args.url)}{args.health_path} did not answer 200 within {args.timeout:g} s (last: {last})")
        return None
    plan, _ = await prepare(LoadOptions(base=load, mix=args.mix, prompts=args.prompts), say=say)
    return await ramp_up(load, ramp, plan.source, target, say=say)
