"""Subcommands of the ``inferwatch`` CLI; each module has ``register(subparsers)``."""

from __future__ import annotations

import argparse

from alert_rules.engine import RuleFileError, parse_duration_ms


def duration_arg(text: str) -> str:
    """An argparse ``type`` for a duration flag (``15m``, ``1h30m``, as in rule files): the text, checked."""
    try:
        parse_duration_ms(text, "duration")
    except RuleFileError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text
