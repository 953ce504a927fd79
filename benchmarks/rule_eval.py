"""Benchmark: one evaluation of the built rule set over 10,000 active series holding 6 h of 5 s samples.

The rules are the real ones: ``alert_rules.render.rule_groups(RulesConfig(), DEFAULT_LENGTH_EDGES)``.
Series are generated for every family those rules select, with the label names the catalog
declares and the label values the sidecar writes (every outcome, every length bucket, histogram
buckets from the catalog, engine states), one set per instance (``instance`` label, one model
each) until 10,000 exist. Each is backfilled with 6 h of 5-second samples: counters rise (one in
twenty restarts once, so rate() meets a reset), histogram buckets stay cumulative, gauges wander.

Between timed evaluations, three new samples (15 s at 5 s) are appended to every series,
untimed, so each evaluation sees fresh data and the store trims as it would when live. The
figure is the wall time of one ``evaluate_all`` (every group) on one core, median of several
evaluations 15 s apart, plus the memory the store takes per stored sample and the append cost.

    .venv/bin/python benchmarks/rule_eval.py [--series 10000] [--hours 6] [--write] [--profile] [--digest]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import pstats
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alert_rules.config import RulesConfig
from alert_rules.engine import RecordingRule, RuleEngine, load_groups
from alert_rules.promql.ast import Aggregate, Binary, Call, Negate, Node, RangeSelector, Selector
from alert_rules.promql.evaluate import Evaluator
from alert_rules.promql.parse import parse_expr
from alert_rules.promql.values import Labels, labels_of
from alert_rules.render import rule_groups
from alert_rules.store import SeriesStore
from benchmarks._common import machine, publish, revision
from exporters.catalog import ALL_SPECS, MetricSpec, MetricType
from exporters.records import DEFAULT_LENGTH_EDGES, Outcome, length_bucket_labels

STEP_MS = 5_000
STEPS_PER_EVALUATION = 3
DOMAINS: dict[str, tuple[str, ...]] = {
    "route": ("/v1/completions",),
    "outcome": tuple(o.value for o in Outcome),
    "length_bucket": (*length_bucket_labels(DEFAULT_LENGTH_EDGES), "unknown"),
    "state": ("running", "waiting", "swapped"),
    "reason": ("queue_full", "write_error"),
    "source": ("response_body", "exit_code"),
}
"""Values of the labels that take several; per-instance labels are made from the instance number, any
other label takes one value."""


def rule_document() -> dict[str, Any]:
    """The rule set the sidecar and Prometheus load, with every default."""
    return rule_groups(RulesConfig(), DEFAULT_LENGTH_EDGES)


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


def selected_families(doc: dict[str, Any]) -> list[tuple[str, MetricSpec]]:
    """(sample name, catalog spec) of every raw series the rules read (not recorded ones), in name order."""
    names: set[str] = set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            selectors(parse_expr(rule["expr"]), names)
    names -= {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    names = {n for n in names if not n.startswith("ALERTS")}
    by_sample = {sample: spec for spec in ALL_SPECS for sample in spec.sample_names()}
    missing = sorted(n for n in names if n not in by_sample)
    if missing:
        raise SystemExit(f"rules select series missing from the catalog: {missing}")
    return sorted((n, by_sample[n]) for n in names if n in by_sample)


def label_sets(sample: str, spec: MetricSpec, instance: int) -> list[dict[str, str]]:
    """Every label combination one instance exposes for one sample name."""
    per_instance = {"model_name": f"model-{instance}", "gpu": "0", "uuid": f"GPU-{instance:08x}",
                    "upstream": f"http://10.0.{instance // 256}.{instance % 256}:8000"}
    combos: list[dict[str, str]] = [{"__name__": sample, "instance": f"node-{instance}:9400"}]
    for label in spec.labels:
        values = (per_instance[label],) if label in per_instance else DOMAINS.get(label, ("0",))
        combos = [{**c, label: v} for c in combos for v in values]
    if spec.type is MetricType.HISTOGRAM and sample == spec.bucket:
        bounds = [*(repr(float(b)) for b in spec.buckets or ()), "+Inf"]
        combos = [{**c, "le": le} for c in combos for le in bounds]
    return combos


def sample_values(sample: str, labels: dict[str, str], points: int, rng: random.Random) -> array:
    """``points`` values: rising counters (sometimes one reset), cumulative buckets, wandering gauges."""
    if sample.endswith(("_total", "_count", "_sum", "_bucket")):
        rate = rng.uniform(0.1, 5.0)
        if "le" in labels:
            share = 1.0 if labels["le"] == "+Inf" else min(1.0, float(labels["le"]) / 30.0)
            rate *= share
        values = [float(int(i * rate)) for i in range(points)]
        if rng.random() < 0.05:
            restart = rng.randrange(1, points)
            values[restart:] = [float(int(i * rate)) for i in range(points - restart)]
        return array("d", values)
    level = rng.uniform(0, 100)
    return array("d", [level + (i % 97) * 0.1 for i in range(points)])


def build_store(total: int, hours: float, end_ms: int) -> tuple[SeriesStore, list[tuple[Labels, float, float]]]:
    """Backfill ``total`` series with ``hours`` of 5 s samples ending at ``end_ms``.

    Returns the store and, per series, (labels, last value, increment per step) to extend it.
    """
    families = selected_families(rule_document())
    points = int(hours * 3600_000 / STEP_MS)
    ts = array("q", range(end_ms - (points - 1) * STEP_MS, end_ms + 1, STEP_MS))
    rng = random.Random(7)
    store = SeriesStore(retention_ms=int(hours * 3600_000), max_series=total + 10_000)
    live: list[tuple[Labels, float, float]] = []
    instance = 0
    while len(live) < total:
        for sample, spec in families:
            for mapping in label_sets(sample, spec, instance):
                if len(live) >= total:
                    break
                labels = labels_of(mapping)
                vs = sample_values(sample, mapping, points, rng)
                store.backfill(labels, ts, vs)
                counter = spec.type in (MetricType.COUNTER, MetricType.HISTOGRAM)
                live.append((labels, vs[-1], max(vs[-1] - vs[-2], 1.0) if counter else 0.0))
        instance += 1
    return store, live


def advance(store: SeriesStore, live: list[tuple[Labels, float, float]], from_ms: int) -> tuple[int, float]:
    """Append the next 15 s of samples to every series; returns (samples appended, seconds spent)."""
    appended = 0
    started = time.perf_counter()
    for step in range(1, STEPS_PER_EVALUATION + 1):
        t = from_ms + step * STEP_MS
        for index, (labels, previous, inc) in enumerate(live):
            value = previous + (inc if inc else (step % 2 - 0.5) * 0.25)  # counters rise, gauges wobble
            store.append(labels, t, value)
            live[index] = (labels, value, inc)
            appended += 1
    return appended, time.perf_counter() - started


def digest(engine: RuleEngine, t_ms: int) -> str:
    """A hash of what the engine wrote (recorded and ALERTS series) and of every rule's result at
    ``t_ms`` from a plain evaluator, to compare revisions (float reprs are exact)."""
    h = hashlib.sha256()
    recorded = {r.record for g in engine.groups for r in g.rules if isinstance(r, RecordingRule)}
    for name in sorted(recorded | {"ALERTS", "ALERTS_FOR_STATE"}):
        for series in engine.store.series(name, []):
            h.update(repr((series.labels, list(series.ts[-50:]), list(series.vs[-50:]))).encode())
    evaluator = Evaluator(engine.store)
    for group in engine.groups:
        for rule in group.rules:
            h.update(repr(evaluator.query(rule.expr, t_ms)).encode())
    return h.hexdigest()[:16]


def main() -> int:
    """Run the benchmark; print its figures and, with --write, put them in BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=10_000, help="active series to generate")
    parser.add_argument("--hours", type=float, default=6.0, help="hours of 5 s samples per series")
    parser.add_argument("--evaluations", type=int, default=7, help="timed evaluations (the median is reported)")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one more evaluation")
    parser.add_argument("--digest", action="store_true", help="print a hash of every rule's result")
    args = parser.parse_args()
    end_ms = 1_800_000_000_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store, live = build_store(args.series, args.hours, end_ms)
    stored = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = store.stats()
    buffer_bytes = sum(s.ts.buffer_info()[1] * 8 + s.vs.buffer_info()[1] * 8
                       for f in store._by_name.values() for s in f.values())
    engine = RuleEngine(load_groups(rule_document()), store, default_interval_ms=15_000,
                        recorded_retention_ms=4 * 86_400_000)
    engine.evaluate_all(end_ms)  # the first evaluation creates the recorded series
    durations: list[float] = []
    appended = 0
    append_s = 0.0
    errors: list[str] = []
    t = end_ms
    for _ in range(args.evaluations):
        count, spent = advance(store, live, t)
        appended += count
        append_s += spent
        t += STEPS_PER_EVALUATION * STEP_MS
        gc.collect()
        gc.disable()
        started = time.perf_counter()
        result = engine.evaluate_all(t)
        durations.append((time.perf_counter() - started) * 1000)
        gc.enable()
        errors.extend(result.errors)
    if errors:
        print("evaluation errors:", *errors[:5], sep="\n  ")
    if args.digest:
        print("result digest:", digest(engine, t))
    if args.profile:
        advance(store, live, t)
        t += STEPS_PER_EVALUATION * STEP_MS
        profiler = cProfile.Profile()
        profiler.enable()
        engine.evaluate_all(t)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    rules = sum(len(g.rules) for g in engine.groups)
    median = statistics.median(durations)
    verdict = "met" if median < 100 else "**missed**"
    body = (
        f"One evaluation of every group ({rules} rules from `alert_rules.render.rule_groups(RulesConfig(), "
        f"DEFAULT_LENGTH_EDGES)`) over {stats.series:,} active series holding {args.hours:g} h of 5 s samples "
        f"({stats.samples:,} samples, {len(engine.store):,} series with the recorded and ALERTS ones), "
        "single thread. Series carry the catalog's labels with the values the sidecar writes; counters "
        "include resets. Before each timed evaluation every series gets 15 s of new samples (untimed).\n\n"
        "| figure | value |\n|---|---|\n"
        f"| evaluation time, median of {args.evaluations} (min / max) | **{median:.1f} ms** "
        f"({min(durations):.1f} / {max(durations):.1f} ms); target < 100 ms: {verdict} |\n"
        f"| sample buffers per stored sample | {buffer_bytes / stats.samples:.2f} bytes "
        "(int64 timestamp + float64 value in `array`) |\n"
        f"| all store memory per stored sample (tracemalloc, series objects and indexes included) | "
        f"{stored / stats.samples:.2f} bytes |\n"
        f"| append, per sample (untimed part, {appended:,} samples) | {append_s / appended * 1e6:.2f} µs |\n\n"
        "Run `--profile` for where the time goes, `--digest` for a hash of the results.\n\n"
        f"Command: `.venv/bin/python benchmarks/rule_eval.py --series {args.series} --hours {args.hours:g} "
        f"--evaluations {args.evaluations} --write` at {revision()} on {machine()}.\n"
    )
    publish("Rule evaluation", body, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
