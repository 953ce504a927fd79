"""`inferwatch loadtest` and `inferwatch warmup`: measure a vLLM deployment, or warm a cold one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from serving.loadgen import Distribution, LoadReport, LoadSpec, WarmupSpec

DEFAULT_REQUESTS = 100
DEFAULT_CONCURRENCY = 8

LOADTEST_HELP = """Send a bounded load (--requests N, --duration S, or both: whichever ends first) to an
OpenAI-compatible server, vLLM directly or through `inferwatch serve`, and report what the client saw:
p50/p90/p99 of time to first token (streamed only), inter-token gaps and end-to-end latency,
requests/s, output tokens/s (from usage), errors by status, and the trace ids of the slowest
requests (returned by the sidecar in x-trace-id; look them up with `inferwatch logs search`).
Load is either --concurrency C workers, each sending its next request when the last one ends,
or --rate R requests/s started on a fixed schedule (request i at i/R s) whatever the latency.
Without either, --concurrency 8; without --requests or --duration, --requests 100.
Progress goes to stderr about once a second; the table (or --json) to stdout.
Exit 1 when any request failed."""
WARMUP_HELP = """Wait until GET URL+--health-path answers 200, then send small streamed requests one at a
time until the last --window TTFTs all lie within --settle-ratio of their median, or within
--settle-floor-ms of it when that is larger (the server has compiled its kernels and filled its
caches), or the budget (--max-requests, --timeout) runs out.
Exit 0 when TTFT settled, 1 when not (with the reason). Against the sidecar use --health-path /readyz."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `loadtest` and `warmup` commands."""
    raw = argparse.RawDescriptionHelpFormatter
    loadtest = subparsers.add_parser("loadtest", help="Measure a vLLM server (or the sidecar) under a bounded load.",
                                     description=LOADTEST_HELP, formatter_class=raw)
    _add_target(loadtest)
    amount = loadtest.add_argument_group("how much (at least one is used; both: whichever ends first)")
    amount.add_argument("--requests", type=int, metavar="N", help=f"Requests to send (default {DEFAULT_REQUESTS}).")
    amount.add_argument("--duration", type=float, metavar="S", help="Seconds to keep starting requests.")
    pace = loadtest.add_mutually_exclusive_group()
    pace.add_argument("--concurrency", type=int, metavar="C",
                      help=f"Requests in flight at all times, closed loop (default {DEFAULT_CONCURRENCY}).")
    pace.add_argument("--rate", type=float, metavar="R", help="Requests started per second, open loop.")
    loadtest.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                          help="Stream the answers (TTFT and inter-token gaps are measured only when streamed).")
    loadtest.add_argument("--prompt-tokens", type=int, default=32, metavar="P",
                          help="Prompt length in words, about one token each (default 32; usage gives the real count).")
    loadtest.add_argument("--max-tokens", type=int, default=64, metavar="T",
                          help="max_tokens per request (default 64).")
    loadtest.add_argument("--ignore-eos", action="store_true",
                          help="Ask vLLM to generate exactly max_tokens (ignore_eos, a vLLM extension).")
    loadtest.add_argument("--timeout", type=float, default=60.0, metavar="S",
                          help="Seconds one request may take in all (default 60).")
    loadtest.add_argument("--max-in-flight", type=int, default=256, metavar="N",
                          help="With --rate: most requests in flight; later ones wait and count as late "
                          "(default 256).")
    loadtest.add_argument("--json", action="store_true", help="Print one JSON object instead of the table.")
    loadtest.add_argument("--quiet", action="store_true", help="No progress lines on stderr.")
    loadtest.set_defaults(func=run_loadtest)

    warmup = subparsers.add_parser("warmup", help="Warm a cold vLLM server until its TTFT has settled.",
                                   description=WARMUP_HELP, formatter_class=raw)
    _add_target(warmup)
    warmup.add_argument("--max-requests", type=int, default=50, metavar="N",
                        help="Most warm-up requests to send (default 50).")
    warmup.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="Seconds in all, health wait included (default 300).")
    warmup.add_argument("--settle-ratio", type=float, default=0.2, metavar="F",
                        help="Settled when the last --window TTFTs are within F of their median (default 0.2).")
    warmup.add_argument("--settle-floor-ms", type=float, default=20.0, metavar="MS",
                        help="...or within MS milliseconds, whichever is larger, so that scheduling jitter on a "
                        "fast server is not mistaken for a cold one (default 20).")
    warmup.add_argument("--window", type=int, default=5, metavar="K", help="TTFTs judged together (default 5).")
    warmup.add_argument("--health-path", default="/health", metavar="PATH",
                        help="Readiness path (default /health, vLLM's; /readyz on the sidecar).")
    warmup.add_argument("--max-tokens", type=int, default=4, metavar="T", help="max_tokens per request (default 4).")
    warmup.add_argument("--json", action="store_true", help="Print one JSON object at the end instead of lines.")
    warmup.set_defaults(func=run_warmup)


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, metavar="URL",
                        help="Base URL of vLLM or the sidecar, e.g. http://127.0.0.1:9100 (a trailing /v1 is fine).")
    parser.add_argument("--model", required=True, metavar="M", help="The served model name.")
    parser.add_argument("--chat", action="store_true", help="Use /v1/chat/completions instead of /v1/completions.")


def loadtest_spec(args: argparse.Namespace) -> LoadSpec:
    """The validated load spec of parsed `loadtest` arguments (ConfigError names the bad option)."""
    requests = args.requests
    if requests is None and args.duration is None:
        requests = DEFAULT_REQUESTS
    concurrency = args.concurrency
    if concurrency is None and args.rate is None:
        concurrency = DEFAULT_CONCURRENCY
    return LoadSpec(
        url=args.url, model=args.model, requests=requests, duration_s=args.duration, concurrency=concurrency,
        rate=args.rate, stream=args.stream, chat=args.chat, prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, timeout_s=args.timeout,
        max_in_flight=args.max_in_flight,
    ).validate()


def run_loadtest(args: argparse.Namespace) -> int:
    """Run `inferwatch loadtest`; exit 1 when any request failed."""
    from serving.loadgen import format_progress, run_load

    spec = loadtest_spec(args)

    def progress(reading: Any) -> None:
        print(format_progress(reading), file=sys.stderr, flush=True)

    report = asyncio.run(run_load(spec, on_progress=None if args.quiet else progress))
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(format_report(spec, report))
    return 1 if report.failed else 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _row(name: str, d: Distribution) -> str:
    cells = (d.p50, d.p90, d.p99, d.mean, d.max)
    return f"{name:<8}" + "".join(f"{_ms(v):>10}" for v in cells) + f"{d.count:>8}"


def format_report(spec: LoadSpec, report: LoadReport) -> str:
    """The human-readable report."""
    bound = " and ".join(part for part in (
        f"{spec.requests} requests" if spec.requests is not None else "",
        f"{spec.duration_s:g} s" if spec.duration_s is not None else "") if part)
    pace = f"at {spec.rate:g} requests/s (open loop)" if spec.rate is not None else \
        f"at concurrency {spec.concurrency}"
    per_request = report.tokens_per_request
    lines = [
        f"target      {report.url} (model {report.model}, {'streamed' if report.stream else 'not streamed'})",
        f"load        up to {bound} {pace}",
        f"requests    {report.sent} sent, {report.ok} ok, {report.failed} failed in {report.wall_s:.2f} s",
        f"throughput  {report.requests_per_s:.2f} ok requests/s, {report.output_tokens_per_s:.1f} output tokens/s",
        f"tokens      {report.prompt_tokens} prompt, {report.completion_tokens} output"
        + (f" (per request: min {per_request.min:g}, max {per_request.max:g})" if per_request.count else ""),
    ]
    if spec.rate is not None:
        lines.append(f"start lag   {report.max_start_lag_s * 1000:.1f} ms at most behind schedule")
    lines += ["", "ms      " + "".join(f"{h:>10}" for h in ("p50", "p90", "p99", "mean", "max")) + f"{'n':>8}",
              _row("TTFT", report.ttft_s), _row("ITL", report.itl_s), _row("e2e", report.e2e_s), ""]
    if report.errors:
        lines.append("errors")
        lines += [f"  {kind}: {count} ({report.error_details.get(kind, '')})" for kind, count in report.errors.items()]
    else:
        lines.append("errors      none")
    lines.append(f"slowest {'e2e ms':>10}  {'status':<17} trace_id")
    for slow in report.slowest:
        status = slow.error if slow.error and not slow.error.isdigit() else str(slow.status)
        lines.append(f"{'':8}{slow.e2e_s * 1000:>10.1f}  {status:<17} {slow.trace_id or '-'}")
    if report.sent and report.trace_ids_missing == report.sent:
        lines.append("(no x-trace-id in the answers: the target is not the sidecar)")
    return "\n".join(lines)


def warmup_spec(args: argparse.Namespace) -> WarmupSpec:
    """The validated warm-up spec of parsed `warmup` arguments."""
    return WarmupSpec(url=args.url, model=args.model, max_requests=args.max_requests, timeout_s=args.timeout,
                      settle_ratio=args.settle_ratio, settle_floor_s=args.settle_floor_ms / 1000,
                      window=args.window, health_path=args.health_path, chat=args.chat,
                      max_tokens=args.max_tokens).validate()


def run_warmup(args: argparse.Namespace) -> int:
    """Run `inferwatch warmup`; exit 0 when TTFT settled, 1 when not within the budget."""
    from serving.loadgen import warm_up

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
