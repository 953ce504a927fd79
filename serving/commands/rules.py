"""`inferwatch rules ...` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `rules` command group."""
    parser = subparsers.add_parser("rules", help="(not yet implemented)")
    parser.set_defaults(func=lambda _args: 2)
