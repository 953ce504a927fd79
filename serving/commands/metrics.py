"""`inferwatch metrics ...` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `metrics` command group."""
    parser = subparsers.add_parser("metrics", help="(not yet implemented)")
    parser.set_defaults(func=lambda _args: 2)
