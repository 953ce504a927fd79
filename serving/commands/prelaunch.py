"""`inferwatch prelaunch`: the launch checklist against a deployment, one verdict per line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from serving.loadtest.capacity import DEFAULT_HEADROOM_PER_100_RPM
from serving.loadtest.errors import LoadTestError
from serving.prelaunch import baseline as bl
from serving.prelaunch import checklist
from serving.prelaunch.checklist import Item
from serving.prelaunch.items import ORDER, Context, PrelaunchSpec, Say, warm

KEYS = tuple(run.__name__ for run in ORDER)

STARTERS = ("--url", "--model", "--restart-cmd", "--kill-match", "--expected-rpm", "--report", "--baseline",
            "--compare", "--json")

HELP = """Run the launch checklist against a deployment (vLLM, or better the inferwatch sidecar in front of it)
and write checklist.md and checklist.json into --report DIR: one item per line of the checklist, each
pass or fail (measured, with its numbers and the trace ids to look at) or manual (what it needs, and
what to check by hand). The lines: a 512/8k/32k mix at 7:2:1 (lengths above the model's context capped,
with a warning), a queue of its own for long prompts (the sidecar's lanes), consecutive requests at the
maximum context, network jitter through a delaying proxy (--jitter-min-ms..--jitter-max-ms) with what
the client's timeout and backoff did, requests sharing a long prefix against the 85 % prefix-cache
target (vLLM's own counters, with KV usage and TTFT against distinct prefixes), the capacity for
--expected-rpm with headroom per 100 rpm, the baseline profile of the mix with the GPUs' power and
temperature during it from the sidecar's NVML series (--baseline FILE saves it, manual without them;
--compare FILE flags p99 +10 %, throughput -10 %, power +10 %, tokens per joule -10 % and the hottest
GPU +5 degrees C), fast retries the sidecar counted (the same request again within 500 ms), cold-start
shocks (--restart-cmd) and recovery from kill -9 (--kill-match and --restart-cmd; run last, as they
restart the target). A progress line per item goes to stderr.
Exit 0 when no item failed, 1 when one did, 2 on bad options."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `prelaunch` command."""
    p = subparsers.add_parser("prelaunch", help="Run the launch checklist against a deployment.",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                              usage_flags=STARTERS)
    p.add_argument("--url", required=True, metavar="URL", help="The sidecar (or vLLM), e.g. http://127.0.0.1:9100.")
    p.add_argument("--model", required=True, metavar="M", help="The served model name.")
    p.add_argument("--report", required=True, metavar="DIR", help="Where checklist.md and checklist.json go.")
    p.add_argument("--restart-cmd", metavar="CMD", help="Shell command that restarts the engine (cold starts, "
                   "kill -9); without it those lines are manual.")
    p.add_argument("--kill-match", metavar="PATTERN", help="Regular expression matching exactly one command line: "
                   "the process kill -9 hits.")
    p.add_argument("--expected-rpm", type=float, metavar="N", help="Expected load in requests/min (capacity line).")
    p.add_argument("--headroom-per-100-rpm", type=float, default=DEFAULT_HEADROOM_PER_100_RPM, metavar="F",
                   help="Spare capacity per 100 rpm of expected load (default 0.10).")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--baseline", metavar="FILE", help="Save the profile (latency, throughput, power, "
                      "temperature, tokens per joule) to FILE.")
    base.add_argument("--compare", metavar="FILE", help="Compare with a saved profile; regressions fail the line.")
    p.add_argument("--p99-rise", type=float, default=0.10, metavar="F",
                   help="With --compare: p99 latency may rise by this share (default 0.10).")
    p.add_argument("--throughput-drop", type=float, default=0.10, metavar="F",
                   help="With --compare: throughput may drop by this share (default 0.10).")
    p.add_argument("--power-rise", type=float, default=0.10, metavar="F",
                   help="With --compare: the GPUs' mean power during the mix may rise by this share (default 0.10).")
    p.add_argument("--tokens-per-joule-drop", type=float, default=0.10, metavar="F",
                   help="With --compare: tokens per joule may drop by this share (default 0.10).")
    p.add_argument("--temperature-rise", type=float, default=5.0, metavar="C",
                   help="With --compare: the hottest GPU may be this many degrees Celsius warmer (default 5).")
    sizes = p.add_argument_group("how much each line sends (defaults are the checklist's)")
    sizes.add_argument("--mix", default="512:7,8192:2,32768:1", metavar="LEN:W,...", help="The mixed load's lengths.")
    sizes.add_argument("--mix-requests", type=int, default=100, metavar="N", help="Requests of the mix (100).")
    sizes.add_argument("--concurrency", type=int, default=4, metavar="C", help="Closed-loop concurrency (4).")
    sizes.add_argument("--long-requests", type=int, default=100, metavar="N",
                       help="Consecutive requests at the maximum context (100).")
    sizes.add_argument("--cold-starts", type=int, default=3, metavar="N", help="Restarts in the mixed load (3).")
    sizes.add_argument("--cold-start-duration", type=float, default=60.0, metavar="S",
                       help="Seconds of the mixed load the restarts are spread over (60).")
    sizes.add_argument("--jitter-min-ms", type=float, default=300.0, metavar="MS", help="Smallest delay (300).")
    sizes.add_argument("--jitter-max-ms", type=float, default=5000.0, metavar="MS", help="Largest delay (5000).")
    sizes.add_argument("--jitter-requests", type=int, default=20, metavar="N", help="Requests through it (20).")
    sizes.add_argument("--jitter-timeout", type=float, default=10.0, metavar="S",
                       help="The client's timeout per request through the jitter (10).")
    sizes.add_argument("--prefix-requests", type=int, default=1000, metavar="N",
                       help="Requests sharing a prefix, and as many with distinct ones (1000).")
    sizes.add_argument("--prefix-tokens", type=int, default=1024, metavar="T",
                       help="Length of the shared prefix in the target's tokens, capped to the context (1024).")
    sizes.add_argument("--prefix-target", type=float, default=0.85, metavar="F",
                       help="Prefix-cache hit ratio to reach (0.85).")
    sizes.add_argument("--max-tokens", type=int, default=16, metavar="T", help="max_tokens per request (16).")
    where = p.add_argument_group("where to read and wait")
    where.add_argument("--metrics-url", default="", metavar="URL", help="The sidecar's /metrics (default URL/metrics).")
    where.add_argument("--engine-metrics-url", default="", metavar="URL",
                       help="vLLM's own /metrics, for its prefix-cache counters (default: --metrics-url).")
    where.add_argument("--health-path", default="/health", metavar="PATH",
                       help="Readiness path after a restart (/health; /readyz on the sidecar).")
    where.add_argument("--restart-timeout", type=float, default=600.0, metavar="S",
                       help="Seconds a restart may take until ready (600).")
    where.add_argument("--kill-load", type=float, default=5.0, metavar="S",
                       help="Seconds of load before the kill -9, and again after recovery (5).")
    p.add_argument("--only", type=_keys, metavar="KEY,...", help=f"Run only these lines ({', '.join(KEYS)}).")
    p.add_argument("--json", action="store_true", help="Print checklist.json's document instead of the table.")
    p.set_defaults(func=run_prelaunch)


def _keys(text: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"{unknown[0] if unknown else text!r} is not a line of the checklist; "
                                         f"the lines: {', '.join(KEYS)}")
    return keys


def spec_of(args: argparse.Namespace) -> PrelaunchSpec:
    """The checklist's spec from parsed arguments."""
    return PrelaunchSpec(
        url=args.url, model=args.model, metrics_url=args.metrics_url, engine_metrics_url=args.engine_metrics_url,
        restart_cmd=args.restart_cmd, kill_match=args.kill_match, expected_rpm=args.expected_rpm,
        headroom_per_100_rpm=args.headroom_per_100_rpm, baseline=Path(args.baseline) if args.baseline else None,
        compare=Path(args.compare) if args.compare else None, limits=bl.Limits(
            args.p99_rise, args.throughput_drop, args.power_rise, args.tokens_per_joule_drop, args.temperature_rise),
        mix=args.mix, mix_requests=args.mix_requests, concurrency=args.concurrency, long_requests=args.long_requests,
        cold_starts=args.cold_starts, cold_start_s=args.cold_start_duration, jitter_min_s=args.jitter_min_ms / 1000,
        jitter_max_s=args.jitter_max_ms / 1000, jitter_requests=args.jitter_requests,
        jitter_timeout_s=args.jitter_timeout, prefix_requests=args.prefix_requests, prefix_tokens=args.prefix_tokens,
        prefix_target=args.prefix_target, max_tokens=args.max_tokens, health_path=args.health_path,
        restart_timeout_s=args.restart_timeout, kill_load_s=args.kill_load,
    )


async def run_checklist(spec: PrelaunchSpec, progress: Say, only: tuple[str, ...] = KEYS
                        ) -> tuple[list[Item], list[str]]:
    """Warm the target, then run the items (``only`` these, in the checklist's order); each item's progress
    line goes to ``progress``."""
    ctx = Context(spec, lambda line: progress(f"  {line}"))
    progress("warm-up")
    await warm(ctx)
    runs = [run for run in ORDER if run.__name__ in only]
    items: list[Item] = []
    for number, run in enumerate(runs, 1):
        progress(f"[{number}/{len(runs)}] {run.__name__.replace('_', ' ')}")
        try:
            item = await run(ctx)
        except (LoadTestError, aiohttp.ClientError, TimeoutError, OSError) as err:  # this line fails, the rest run
            line = (run.__doc__ or run.__name__).strip().splitlines()[0].rstrip(".")
            item = Item(run.__name__, line, "fail", f"Could not run: {type(err).__name__}: {err}")
        items.append(item)
        progress(f"[{number}/{len(runs)}] {item.verdict.upper()}: {item.line}: {item.finding}")
    return items, ctx.warnings


def run_prelaunch(args: argparse.Namespace) -> int:
    """Run `inferwatch prelaunch`: exit 0 when no item failed, 1 when one did."""
    spec = spec_of(args)
    started, origin = time.time(), time.monotonic()

    def progress(line: str) -> None:
        print(f"prelaunch: {line}", file=sys.stderr, flush=True)

    items, warnings = asyncio.run(run_checklist(spec, progress, args.only or KEYS))
    doc = checklist.document(items, url=spec.url, model=spec.model, started_unix=started,
                             wall_s=time.monotonic() - origin, warnings=warnings)
    paths = checklist.write(Path(args.report), doc)
    progress(f"written: {', '.join(map(str, paths))}")
    if args.json:
        print(json.dumps(doc))
    else:
        for item in items:
            print(f"{item.verdict:6}  {item.line}: {item.finding}")
    return checklist.exit_code(items)
