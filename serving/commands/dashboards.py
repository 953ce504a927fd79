"""`inferwatch dashboards ...` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `dashboards` command group."""
    parser = subparsers.add_parser("dashboards", help="(not yet implemented)")
    parser.set_defaults(func=lambda _args: 2)
