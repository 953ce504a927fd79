"""The ``inferwatch`` command line: thin wrappers that build settings and call one service each."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from exporters.errors import ConfigError, InferwatchError
from serving.config import CONFIG_FLAG_DEST

COMMAND_MODULES = ("serve", "metrics", "gpu", "rules", "dashboards", "logs", "load", "drill", "explain",
                   "showback", "tokenizer", "shadow", "prelaunch")

EPILOG = """exit codes: 0 success, 1 a check failed or nothing was found, 2 bad usage or configuration.
Every configuration key can be set in a TOML file (--config) or by its own flag; see the README."""


_MORE_KEYS = argparse.Action(["--SECTION-KEY"], "more_keys", metavar="VALUE")
"""Stands in the usage line for the configuration keys' flags."""
_MORE_OPTIONS = argparse.Action(["OPTION ..."], "more_options", nargs=0)
"""Stands in the usage line for the flags a command leaves to ``--help``."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with a short usage line, and a usage error that is the error and a pointer to ``--help``.

    ``serve`` has a flag for every configuration key (about 190 of them): the usage line leaves them out,
    ``[--SECTION-KEY VALUE]`` standing for them, and ``--help`` lists them in one group per section. A command
    with many flags of its own names the few people start with (``usage_flags=``, given to ``add_parser``);
    ``[OPTION ...]`` stands for the rest, which ``--help`` lists in its groups. Every flag is accepted either
    way. Subcommand parsers are made of this class too.
    """

    def __init__(self, *args: Any, usage_flags: Iterable[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.usage_flags = None if usage_flags is None else frozenset(usage_flags)

    def error(self, message: str) -> NoReturn:
        """Print the problem and where the options are described; exit 2 (bad usage)."""
        self.exit(2, f"{self.prog}: error: {message}\nRun '{self.prog} --help' for the options.\n")

    def _usage_actions(self) -> list[argparse.Action]:
        """The arguments the usage line shows: positionals, -h, and the flags people start with."""
        shown, keys_left, options_left = [], False, False
        for action in self._actions:
            if (not action.option_strings or isinstance(action, argparse._HelpAction)
                    or action.help == argparse.SUPPRESS):
                shown.append(action)
            elif action.dest.startswith(CONFIG_FLAG_DEST):
                keys_left = True
            elif (action.required or self.usage_flags is None
                    or not self.usage_flags.isdisjoint(action.option_strings)):
                shown.append(action)
            else:
                options_left = True
        optionals = [a for a in shown if a.option_strings]
        positionals = [a for a in shown if not a.option_strings]
        return [*optionals, *([_MORE_OPTIONS] if options_left else []), *([_MORE_KEYS] if keys_left else []),
                *positionals]

    def format_usage(self) -> str:
        """The short usage line."""
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._usage_actions(), self._mutually_exclusive_groups)
        return formatter.format_help()

    def format_help(self) -> str:
        """argparse's help with the short usage line."""
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._usage_actions(), self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        for group in self._action_groups:
            formatter.start_section(group.title)
            formatter.add_text(group.description)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


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
