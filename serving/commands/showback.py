"""`inferwatch showback --prometheus URL | --sidecar URL --from T --to T --out DIR [--json]`: who used what, and the
cost, by tenant and cost pool: report.md, report.csv, report.json and PNG plots."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from serving.commands.logs import parse_time as logs_time
from serving.showback.report import build_report, write_report
from serving.showback.sources import from_prometheus, from_sidecar

HELP = """Usage and cost by tenant, model and cost pool over a period, from Prometheus (--prometheus: any window
its retention holds, extrapolated as increase() is) or a sidecar (--sidecar: its own ledger, exact, 5-minute
buckets, up to 8 days back). Writes report.md, report.csv, report.json and the PNGs usage_by_tenant.png and
cost_share.png into --out; every total is the sum of the rows. Times: ISO 8601 (2026-12-01T09:00:00Z),
Unix seconds, 'now', or an age (7d, 24h, 30m: that long before now)."""


def parse_time(text: str) -> float:
    """Unix seconds of 'now' or of a time ``inferwatch logs`` reads (ISO 8601, Unix seconds, an age like 7d).

    Raises:
        argparse.ArgumentTypeError: not a time.
    """
    return time.time() if text.strip() == "now" else logs_time(text) / 1000.0


def _run(args: argparse.Namespace) -> int:
    try:
        start, end = parse_time(args.from_), parse_time(args.to)
    except argparse.ArgumentTypeError as err:
        print(f"inferwatch showback: {err}", file=sys.stderr)
        return 2
    if end <= start:
        print(f"inferwatch showback: --to ({args.to}) must be after --from ({args.from_})", file=sys.stderr)
        return 2
    if args.prometheus:
        rows, currency, source = from_prometheus(args.prometheus, start, end), args.currency, \
            f"Prometheus {args.prometheus}"
    else:
        rows, currency = from_sidecar(args.sidecar, start, end)
        source = f"sidecar {args.sidecar}"
    document = build_report(rows, start, end, currency, source)
    written = write_report(document, Path(args.out), plots=not args.no_plots)
    if args.json:
        print(json.dumps({**document, "out": args.out, "files": written}))
    else:
        totals = document["totals"]
        print(f"{len(document['by_tenant'])} tenants, {totals['requests']:,} requests, "
              f"{totals['gpu_seconds']:,.1f} GPU-seconds, cost {totals['cost']:,.4f} {currency}")
        print(f"wrote {', '.join(written)} into {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `showback` command."""
    parser = subparsers.add_parser("showback", help="Usage and cost by tenant and cost pool over a period.",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus's base URL, e.g. http://prometheus:9090.")
    source.add_argument("--sidecar", metavar="URL", help="The sidecar's base URL, e.g. http://127.0.0.1:9100.")
    parser.add_argument("--from", dest="from_", required=True, metavar="T", help="Start of the period.")
    parser.add_argument("--to", default="now", metavar="T", help="End of the period (default now).")
    parser.add_argument("--out", required=True, metavar="DIR", help="Directory the report is written into.")
    parser.add_argument("--currency", default="USD",
                        help="With --prometheus: the currency of the sidecars' cost.currency (default USD).")
    parser.add_argument("--no-plots", action="store_true", help="Skip the PNGs (no matplotlib needed).")
    parser.add_argument("--json", action="store_true", help="Print the report document as JSON too.")
    parser.set_defaults(func=_run)
