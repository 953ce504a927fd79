"""`inferwatch rules build|test|eval`: write the rule files, run unit tests, replay series."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from exporters.errors import ConfigError

FORMATS = ("prometheus", "prometheus-operator")
"""What ``rules build --format`` writes: the plain files, or those and the operator's objects."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `rules` command group."""
    from serving.config import add_config_flags

    parser = subparsers.add_parser("rules", help="Alert and recording rules: build, unit-test, replay.")
    sub = parser.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)

    build = sub.add_parser("build", help="Write Prometheus rule files, alertmanager.yml, promtool tests "
                           "and runbooks.")
    add_config_flags(build)
    build.add_argument("--out", required=True, metavar="DIR", help="Output directory.")
    build.add_argument("--format", choices=FORMATS, default=FORMATS[0],
                       help="prometheus: the plain files; prometheus-operator: those, and also "
                       "DIR/prometheus-operator/ with one PrometheusRule per rule file and the routing "
                       "as an AlertmanagerConfig (default: %(default)s).")
    build.set_defaults(func=_build)

    test = sub.add_parser("test", help="Run promtool-format unit-test files against the embedded "
                          "evaluator (exit 1 on any failure).")
    test.add_argument("files", nargs="+", metavar="FILE")
    test.set_defaults(func=_test)

    replay = sub.add_parser("eval", help="Evaluate the rule set over promtool-style input_series and "
                            "print each alert's state changes.")
    add_config_flags(replay)
    replay.add_argument("--rules", metavar="FILE", help="Evaluate this rule file instead of the built set.")
    replay.add_argument("--series", required=True, metavar="FILE",
                        help="YAML: {interval: 1m, input_series: [...]} or a bare input_series list.")
    replay.add_argument("--start", default="0s", metavar="S", help="First evaluation time (duration).")
    replay.add_argument("--end", required=True, metavar="E", help="Last evaluation time (duration).")
    replay.add_argument("--step", default="1m", metavar="D", help="Evaluation interval (duration).")
    replay.add_argument("--json", action="store_true", help="One JSON object per line.")
    replay.set_defaults(func=_eval)


def _build(args: argparse.Namespace) -> int:
    from alert_rules.build import write_all  # written alongside the rules; imported only when used
    from serving.config import settings_from_args

    settings = settings_from_args(args)
    write_all(settings, Path(args.out))
    if args.format == "prometheus-operator":
        from alert_rules import prometheus_operator

        prometheus_operator.write_all(settings, Path(args.out))
    return 0


def _test(args: argparse.Namespace) -> int:
    from alert_rules.promtool_runner import run_files

    results, report = run_files(args.files)
    print(report)
    return 0 if all(r.ok for r in results) else 1


def _rule_document(args: argparse.Namespace) -> dict[str, Any]:
    if args.rules:
        try:
            document: dict[str, Any] = yaml.safe_load(Path(args.rules).read_text())
            return document
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError("--rules", f"cannot read the rule file: {err}", args.rules) from err
    from alert_rules.render import rule_groups
    from serving.config import settings_from_args

    return rule_groups(settings_from_args(args))


def _eval(args: argparse.Namespace) -> int:
    from alert_rules.engine import RuleEngine, RuleFileError, load_groups, parse_duration_ms
    from alert_rules.promtool_runner import TestFileError, load_series
    from alert_rules.store import SeriesStore

    try:
        start = parse_duration_ms(args.start, "--start")
        end = parse_duration_ms(args.end, "--end")
        step = parse_duration_ms(args.step, "--step")
    except RuleFileError as err:
        raise ConfigError("--start/--end/--step", str(err)) from err
    if step <= 0 or end < start:
        raise ConfigError("--step", "needs a positive step and --end not before --start")
    try:
        series_doc = yaml.safe_load(Path(args.series).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError("--series", f"cannot read the series file: {err}", args.series) from err
    if isinstance(series_doc, list):
        series_doc = {"input_series": series_doc}
    if not isinstance(series_doc, dict):
        raise ConfigError("--series", "expected a mapping with input_series, or a list", args.series)
    groups = load_groups(_rule_document(args), args.rules or "built rules")
    forever = 10 * 365 * 86_400_000
    store = SeriesStore(retention_ms=forever, max_series=10_000_000)
    try:
        interval = parse_duration_ms(series_doc.get("interval") or args.step, "interval")
        load_series(store, series_doc.get("input_series") or [], interval)
    except (TestFileError, RuleFileError) as err:
        raise ConfigError("--series", str(err), args.series) from err
    engine = RuleEngine(groups, store, default_interval_ms=step, recorded_retention_ms=forever)
    t = start
    while t <= end:
        step_result = engine.evaluate_all(t)
        for error in step_result.errors:
            print(f"inferwatch: at {(t - start) / 1000:g}s: {error}", file=sys.stderr)
        for change in step_result.transitions:
            labels = dict(change.labels)
            at = (change.at_ms - start) / 1000
            if args.json:
                print(json.dumps({"alert": change.alert, "labels": labels, "state": change.state,
                                  "at": at}, sort_keys=True))
            else:
                shown = ", ".join(f'{k}="{v}"' for k, v in labels.items())
                print(f"{at:>10g}s  {change.state:<9} {change.alert} {{{shown}}}")
        t += step
    return 0
