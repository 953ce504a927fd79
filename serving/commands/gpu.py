"""`inferwatch gpu ...` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `gpu` command group."""
    parser = subparsers.add_parser("gpu", help="(not yet implemented)")
    parser.set_defaults(func=lambda _args: 2)
