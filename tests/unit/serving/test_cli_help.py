"""The command line's help: short usage lines, flags grouped, and every flag still accepted."""

from __future__ import annotations

import argparse

import pytest

from exporters.configuring import FieldDoc
from serving.cli import Parser, build_parser
from serving.config import CONFIG_FLAG_DEST, SECTIONS, all_field_docs

CONFIG_COMMANDS = (("serve",), ("rules", "build"), ("rules", "eval"), ("dashboards", "build"), ("logs", "ingest"))
# the flags scripts call these commands with: all of them stay accepted, whatever the usage line shows
FLAGS = {
    ("loadtest",): [
        "--arrivals", "--chat", "--cold-starts", "--concurrency", "--config", "--duration", "--expected-rpm",
        "--headroom-per-100-rpm", "--health-path", "--ignore-eos", "--json", "--max-in-flight", "--max-tokens",
        "--metrics-url", "--mix", "--model", "--no-stream", "--preset", "--prompt-tokens", "--prompts", "--quiet",
        "--rate", "--replay", "--replay-speed", "--report", "--requests", "--restart-cmd", "--restart-timeout",
        "--retry-initial-ms", "--retry-max-ms", "--scrape-interval", "--seed", "--shock-window", "--slo-latency-s",
        "--slo-objective", "--step-duration", "--stream", "--timeout", "--url",
    ],
    ("warmup",): [
        "--chat", "--config", "--from-rps", "--health-path", "--hold", "--json", "--max-requests", "--max-tokens",
        "--mix", "--model", "--over", "--prompt-tokens", "--prompts", "--seed", "--settle-floor-ms", "--settle-ratio",
        "--slo-latency-s", "--slo-objective", "--timeout", "--to-rps", "--url", "--window", "--window-s",
    ],
    ("drill", "kill"): [
        "--after", "--before", "--concurrency", "--health-path", "--json", "--match", "--max-tokens", "--model",
        "--pid", "--restart-cmd", "--sidecar", "--timeout", "--url",
    ],
}


def _parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = build_parser()
    for name in path:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subparsers.choices[name]
    return parser


def _usage_lines(path: tuple[str, ...]) -> list[str]:
    return _parser(path).format_usage().strip().splitlines()


@pytest.mark.parametrize("path", [*CONFIG_COMMANDS, *FLAGS], ids=" ".join)
def test_the_usage_line_is_short(path: tuple[str, ...]) -> None:
    """A few lines: the flags people start with, and a stand-in for the rest (serve's once listed ~190 flags)."""
    lines = _usage_lines(path)
    assert len(lines) <= 4, "\n".join(lines)


@pytest.mark.parametrize("path", CONFIG_COMMANDS, ids=" ".join)
def test_config_keys_stand_behind_one_placeholder(path: tuple[str, ...]) -> None:
    """No configuration key's flag is in the usage line; ``[--SECTION-KEY VALUE]`` stands for them."""
    usage = " ".join(_usage_lines(path))
    assert "[--SECTION-KEY VALUE]" in usage
    assert not [doc.flag for doc in all_field_docs() if f"{doc.flag} " in usage]


def test_serve_usage_shows_the_flags_people_start_with() -> None:
    """--upstream, --listen, --workers and --config are what a first `inferwatch serve` uses."""
    usage = " ".join(_usage_lines(("serve",)))
    for flag in ("--upstream URL", "--listen HOST:PORT", "--workers N", "--config FILE"):
        assert flag in usage


@pytest.mark.parametrize("path", CONFIG_COMMANDS, ids=" ".join)
def test_every_config_key_has_a_help_group_per_section(path: tuple[str, ...]) -> None:
    """--help lists the keys in one group per section, each flag under its own section's heading."""
    parser = _parser(path)
    groups = {group.title: group for group in parser._action_groups}
    for doc in all_field_docs():
        group = groups[f"[{doc.section}] keys"]
        assert doc.flag in {s for action in group._group_actions for s in action.option_strings}
    assert [title for title in groups if title and title.endswith("] keys")] == [f"[{s}] keys" for s in SECTIONS]


def test_serve_help_points_to_the_configuration_reference() -> None:
    """The help names the README's configuration reference, where every key's type and default are."""
    assert "'Configuration reference'" in " ".join(_parser(("serve",)).format_help().split())


@pytest.mark.parametrize("doc", all_field_docs(), ids=lambda doc: doc.key)
def test_every_config_key_flag_is_still_accepted(doc: FieldDoc) -> None:
    """Scripts set any key by its flag: `serve --SECTION-KEY VALUE` lands on that key."""
    args = build_parser().parse_args(["serve", doc.flag, "value"])
    assert getattr(args, f"{CONFIG_FLAG_DEST}{doc.key}") == "value"


@pytest.mark.parametrize("path", list(FLAGS), ids=" ".join)
def test_every_flag_of_the_busy_commands_is_still_accepted(path: tuple[str, ...]) -> None:
    """loadtest, warmup and drill kill keep every flag (the usage line shows a few)."""
    parser = _parser(path)
    assert set(FLAGS[path]) <= set(parser._option_string_actions)
    usage = " ".join(_usage_lines(path))
    assert "[OPTION ...]" in usage
    assert "--json" in usage


@pytest.mark.parametrize("path", list(FLAGS), ids=" ".join)
def test_required_flags_stay_in_the_usage(path: tuple[str, ...]) -> None:
    """A flag a command cannot run without is always in its usage line."""
    parser = _parser(path)
    usage = " ".join(_usage_lines(path))
    for action in parser._actions:
        if action.required and action.option_strings:
            assert action.option_strings[0] in usage


def test_subcommand_parsers_are_the_short_usage_parser() -> None:
    """Every subcommand parser is serving.cli.Parser, so all of them get the short usage."""
    assert all(isinstance(_parser(path), Parser) for path in [*CONFIG_COMMANDS, *FLAGS])
