"""`inferwatch shadow report --sidecar URL | --dir ARCHIVE [--since D] [--json]`: is the shadow ready to take traffic?

The shadowed requests come from the sidecar's ring of recent requests (``GET /admin/shadow``) or
from the request-log archive; exporters/shadow_report.py sums them up and gives the verdict. Exit 0
on go, 1 on no-go (each failed condition named).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from alert_rules.engine import parse_duration_ms
from exporters.errors import InferwatchError
from exporters.shadow_report import ShadowSummary, Thresholds, report, summarize
from log_pipeline.errors import ArchiveError
from log_pipeline.query import Archive, Filter
from serving.commands import duration_arg

HELP = """Compare the shadow upstream (serve.shadow_upstream) with the primary over the shadowed requests of
the last --since: match rate of the outputs (exact for greedy requests, else a normalised token edit
distance of 0), p50 and p99 latency ratios (shadow / primary, end to end and TTFT), and the error-ratio
delta; then a go/no-go verdict against the thresholds below. The requests come from the sidecar's
ring of recent requests (--sidecar; serve.explain_ring_size of them) or from the request-log archive
(--dir; every shadowed request's record is kept whatever the sampling). Exit 0 on go, 1 on no-go."""
SIDECAR_TIMEOUT_S = 10.0


class ShadowSourceError(InferwatchError, OSError):
    """The shadowed requests could not be read (exit 1)."""


def _from_sidecar(base: str, since: str) -> list[Mapping[str, Any]]:
    url = f"{base.rstrip('/')}/admin/shadow?{urllib.parse.urlencode({'since': since})}"
    try:
        with urllib.request.urlopen(url, timeout=SIDECAR_TIMEOUT_S) as response:  # noqa: S310 - the user's own --sidecar URL
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ShadowSourceError(f"the sidecar at {base} answered HTTP {err.code} to {url}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ShadowSourceError(f"the sidecar at {base} could not be asked: {getattr(err, 'reason', err)}") from err
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list):
        raise ShadowSourceError(f"the sidecar at {base} sent no request list from {url}")
    return [r for r in requests if isinstance(r, dict)]


def _from_archive(directory: str, since: str) -> Iterable[Mapping[str, Any]]:
    since_ms = int(time.time() * 1000) - parse_duration_ms(since, "--since")
    try:
        return [r for r in Archive(directory).records(Filter(since_ms=since_ms)) if "shadow_result" in r]
    except (ArchiveError, OSError) as err:
        raise ShadowSourceError(f"the archive {directory} could not be read: {err}") from err


def _text(summary: ShadowSummary, body: dict[str, Any]) -> str:
    def show(value: float | None, unit: str = "x") -> str:
        if value is None:
            return "-"
        return f"{value * 100:.1f} %" if unit == "%" else f"{value:.3g}{unit}"

    results = ", ".join(f"{k} {v}" for k, v in sorted(summary.results.items())) or "none"
    lines = [
        f"shadowed requests: {summary.shadowed} ({results})",
        f"match rate:        {show(summary.match_rate, '%')} of {summary.compared} compared"
        f" (mean token edit distance {show(summary.mean_distance, '')})",
        f"e2e latency:       p50 {show(summary.e2e_p50_ratio)}  p99 {show(summary.e2e_p99_ratio)}  (shadow / primary)",
        f"TTFT:              p50 {show(summary.ttft_p50_ratio)}  p99 {show(summary.ttft_p99_ratio)}",
        f"error ratio:       primary {show(summary.primary_error_ratio, '%')}  shadow "
        f"{show(summary.shadow_error_ratio, '%')}  delta {show(summary.error_delta, '%')}",
        f"verdict:           {body['verdict'].upper()}",
    ]
    lines += [f"  - {reason}" for reason in body["reasons"]]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if (args.sidecar is None) == (args.dir is None):
        print("inferwatch shadow report: give exactly one of --sidecar URL and --dir ARCHIVE", file=sys.stderr)
        return 2
    events = _from_sidecar(args.sidecar, args.since) if args.sidecar else _from_archive(args.dir, args.since)
    summary = summarize(events)
    limits = Thresholds(args.min_match_rate, args.max_p50_ratio, args.max_p99_ratio, args.max_error_delta,
                        args.min_requests)
    body = report(summary, limits)
    print(json.dumps(body, indent=2) if args.json else _text(summary, body))
    return 1 if body["reasons"] else 0



def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `shadow` command group."""
    group = subparsers.add_parser("shadow", help="Shadow traffic: compare the shadow upstream with the primary.")
    commands = group.add_subparsers(dest="shadow_command", metavar="SUBCOMMAND", required=True)
    parser = commands.add_parser("report", help="Match rate, latency ratios, error delta and a go/no-go verdict.",
                                 description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", metavar="URL", help="The sidecar's base URL (its ring of recent requests).")
    parser.add_argument("--dir", metavar="ARCHIVE", help="The request-log archive.")
    parser.add_argument("--since", default="1h", type=duration_arg, metavar="DURATION",
                        help="How far back (15m, 2h; default 1h).")
    defaults = Thresholds()
    parser.add_argument("--min-match-rate", type=float, default=defaults.min_match_rate, metavar="RATIO",
                        help="Go needs at least this share of compared outputs to match (default "
                        f"{defaults.min_match_rate:g}).")
    parser.add_argument("--max-p50-ratio", type=float, default=defaults.max_p50_ratio, metavar="RATIO",
                        help=f"Go needs the shadow's p50 e2e latency at most this times the primary's (default "
                        f"{defaults.max_p50_ratio:g}).")
    parser.add_argument("--max-p99-ratio", type=float, default=defaults.max_p99_ratio, metavar="RATIO",
                        help=f"Likewise for p99 (default {defaults.max_p99_ratio:g}).")
    parser.add_argument("--max-error-delta", type=float, default=defaults.max_error_delta, metavar="RATIO",
                        help=f"Go needs the shadow's error ratio at most this above the primary's (default "
                        f"{defaults.max_error_delta:g}).")
    parser.add_argument("--min-requests", type=int, default=defaults.min_requests, metavar="N",
                        help=f"Go needs at least N compared requests (default {defaults.min_requests}).")
    parser.add_argument("--json", action="store_true", help="The report as JSON (schema inferwatch.shadow_report/1).")
    parser.set_defaults(func=_run)
