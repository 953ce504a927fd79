"""`inferwatch dashboards build`: write the Grafana boards and provisioning files."""

from __future__ import annotations

import argparse
import sys

from serving.config import add_config_flags, settings_from_args


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `dashboards` command group."""
    parser = subparsers.add_parser("dashboards", help="Grafana dashboards: build the JSON and provisioning files.")
    commands = parser.add_subparsers(dest="dashboards_command", metavar="COMMAND", required=True)
    build = commands.add_parser(
        "build",
        help="Write dashboard JSON and Grafana provisioning files.",
        description="Write the four dashboards (DIR/dashboards/*.json) and Grafana provisioning files "
        "(DIR/provisioning/dashboards, DIR/provisioning/datasources: Prometheus with exemplar links, "
        "and the trace datasource). Thresholds come from the [rules] section, the length classes from "
        "serve.length_bucket_edges.",
    )
    build.add_argument("--out", metavar="DIR", required=True, help="directory to write into (created if missing)")
    add_config_flags(build)
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    """Build every board and write the files."""
    from dashboards.build import write

    settings = settings_from_args(args)
    try:
        paths = write(args.out, settings.dashboards, settings.rules, tuple(settings.serve.length_bucket_edges))
    except OSError as err:
        print(f"inferwatch dashboards build: cannot write to {args.out}: {err}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
