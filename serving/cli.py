"""The ``inferwatch`` command line: thin wrappers that build settings and call one service each."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from exporters.errors import ConfigError, InferwatchError

COMMAND_MODULES = ("serve", "metrics", "gpu", "rules", "dashboards", "logs", "load", "drill", "explain",
                   "showback", "tokenizer")

EPILOG = """exit codes: 0 success, 1 a check failed or nothing was found, 2 bad usage or configuration.
Every configuration key can be set in a TOML file (--config) or by its own flag; see the README."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is the error and a pointer to ``--help``, not the whole usage.

    ``serve`` has a flag for every configuration key: its usage alone is some 150 lines, which
    buried the one line that said what was wrong. Subcommand parsers are made of this class too.
    """

    def error(self, message: str) -> NoReturn:
        """Print the problem and where the options are described; exit 2 (bad usage)."""
        self.exit(2, f"{self.prog}: error: {message}\nRun '{self.prog} --help' for the options.\n")


def build_parser() -> Parser:
    """The top-level parser with every subcommand registered."""
    parser = Parser(
        prog="inferwatch",
        description="Observability and SLO alerting for vLLM: a measuring proxy, exporters, "
        "alert rules, dashboards and request logs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"serving.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `serve --workers` starts copies of itself
    try:
        return int(args.func(args) or 0)
    except ConfigError as err:
        print(f"inferwatch: configuration error: {err}", file=sys.stderr)
        return 2
    except InferwatchError as err:
        print(f"inferwatch: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
