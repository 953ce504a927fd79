"""Benchmark: one evaluation of the built rule set over 10,000 active series holding 6 h of 5 s samples.

Series are generated for every metric the rules select (many models, every label combination the
rules read, histogram buckets from the catalog) until 10,000 exist, each backfilled with 6 h of
5-second samples (counters rising, gauges wandering). The figure is the wall time of one
``evaluate_all`` (every group) on one core, median of several evaluations 15 s apart, plus the
memory the sample buffers take per stored sample.

    .venv/bin/python benchmarks/rule_eval.py [--series 10000] [--hours 6] [--no-write]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alert_rules.engine import RuleEngine, load_groups
from alert_rules.promql.ast import Aggregate, Binary, Call, Negate, Node, RangeSelector, Selector
from alert_rules.promql.parse import parse_expr
from alert_rules.promql.values import labels_of
from alert_rules.store import SeriesStore
from benchmarks._common import machine, revision, write_section

STEP_MS = 5_000
LES = ("0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "60.0", "+Inf")
OUTCOMES = ("ok", "client_error", "upstream_error", "timeout", "overloaded")
LENGTHS = ("le_512", "le_2048", "le_8192", "le_32768", "gt_32768")


def rule_document() -> dict:
    """The rules author's rule set when present, else a representative set."""
    try:
        from alert_rules.render import rule_groups
        from serving.config import defaults

        return rule_groups(defaults())
    except ImportError:
        return {"groups": [{"name": "fallback", "rules": [
            {"record": "m:err:ratio_rate5m", "expr": 'sum by (model_name) (rate(inferwatch_requests_total'
             '{outcome!="ok"}[5m])) / sum by (model_name) (rate(inferwatch_requests_total[5m]))'},
            {"alert": "P99", "expr": "histogram_quantile(0.99, sum by (model_name, le) (rate("
             "inferwatch_e2e_request_latency_seconds_bucket[5m]))) > 30", "for": "5m"},
        ]}]}


def selectors(node: Node, out: set[str]) -> None:
    """Collect the metric names an expression selects."""
    if isinstance(node, Selector) and node.name:
        out.add(node.name)
    elif isinstance(node, RangeSelector):
        selectors(node.selector, out)
    elif isinstance(node, Call):
        for arg in node.args:
            selectors(arg, out)
    elif isinstance(node, Aggregate):
        selectors(node.expr, out)
    elif isinstance(node, Binary):
        selectors(node.lhs, out)
        selectors(node.rhs, out)
    elif isinstance(node, Negate):
        selectors(node.expr, out)


def label_sets(name: str, model: str) -> list[dict[str, str]]:
    """Label combinations of one metric for one model."""
    base = {"__name__": name, "model_name": model}
    if name.startswith("inferwatch_requests") or name.startswith("inferwatch_e2e"):
        combos = [{**base, "route": "/v1/completions", "outcome": o, "length_bucket": b}
                  for o in OUTCOMES for b in LENGTHS]
    else:
        combos = [base]
    if name.endswith("_bucket"):
        combos = [{**c, "le": le} for c in combos for le in LES]
    return combos


def build_store(total: int, hours: float, end_ms: int) -> tuple[SeriesStore, int]:
    """Backfill ``total`` series with ``hours`` of 5 s samples ending at ``end_ms``."""
    doc = rule_document()
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    names: set[str] = set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            selectors(parse_expr(rule["expr"]), names)
    names -= recorded
    names = {n for n in names if not n.startswith("ALERTS")}
    points = int(hours * 3600_000 / STEP_MS)
    ts = array("q", range(end_ms - (points - 1) * STEP_MS, end_ms + 1, STEP_MS))
    rng = random.Random(7)
    store = SeriesStore(retention_ms=int(hours * 3600_000) + 60_000, max_series=total + 10_000)
    made = 0
    model = 0
    while made < total:
        for name in sorted(names):
            for labels in label_sets(name, f"model-{model}"):
                if made >= total:
                    break
                counter = name.endswith(("_total", "_bucket", "_count", "_sum"))
                if counter:
                    rate = rng.uniform(0.1, 5.0)
                    vs = array("d", (float(int(i * rate)) for i in range(points)))
                else:
                    level = rng.uniform(0, 100)
                    vs = array("d", (level + (i % 97) * 0.1 for i in range(points)))
                store.backfill(labels_of(labels), ts, vs)
                made += 1
        model += 1
    return store, points


def main() -> int:
    """Run the benchmark and write its section of BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--evaluations", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    end_ms = 1_800_000_000_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store, _points = build_store(args.series, args.hours, end_ms)
    stored = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = store.stats()
    buffer_bytes = sum(s.ts.buffer_info()[1] * 8 + s.vs.buffer_info()[1] * 8
                       for f in store._by_name.values() for s in f.values())
    engine = RuleEngine(load_groups(rule_document()), store, default_interval_ms=15_000,
                        recorded_retention_ms=4 * 86_400_000)
    engine.evaluate_all(end_ms)  # warm the parse cache and sorted indexes
    durations = []
    gc.disable()
    for i in range(1, args.evaluations + 1):
        t = end_ms + i * 15_000
        started = time.perf_counter()
        engine.evaluate_all(t)
        durations.append((time.perf_counter() - started) * 1000)
    gc.enable()
    rules = sum(len(g.rules) for g in engine.groups)
    median = statistics.median(durations)
    body = (
        f"One evaluation of every group ({rules} rules from `alert_rules.render.rule_groups`) over "
        f"{stats.series:,} active series holding {args.hours:g} h of 5 s samples ({stats.samples:,} samples), "
        "single thread.\n\n"
        "| figure | value |\n|---|---|\n"
        f"| evaluation time, median of {args.evaluations} (min / max) | **{median:.1f} ms** "
        f"({min(durations):.1f} / {max(durations):.1f} ms); target < 100 ms |\n"
        f"| sample buffers per stored sample | {buffer_bytes / stats.samples:.2f} bytes "
        "(int64 timestamp + float64 value in `array`) |\n"
        f"| all store memory per stored sample (tracemalloc, series objects and indexes included) | "
        f"{stored / stats.samples:.2f} bytes |\n\n"
        f"Command: `.venv/bin/python benchmarks/rule_eval.py --series {args.series} --hours {args.hours:g}` "
        f"at {revision()} on {machine()}.\n"
    )
    print(body)
    if not args.no_write:
        write_section("Rule evaluation", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
