"""Benchmark: the project's rules evaluated by the embedded engine and by real Prometheus 2.42, same series.

The series are ``benchmarks/rule_eval.py``'s (every family the rules read, the catalog's labels, 5 s
samples ending now). They go into the embedded store directly and into Prometheus through
``promtool tsdb create-blocks-from openmetrics``; Prometheus then starts on those blocks with the same
rule file (``alert_rules.render.rule_groups``) and evaluates it on its own schedule. Prometheus' figure
is the sum over groups of ``evaluationTime`` from ``/api/v1/rules`` (its groups run concurrently; the
sum is the work of one evaluation of every group, as the embedded engine does it on one thread), the
median over several evaluations; the embedded one is the median wall time of ``evaluate_all``.

    flock /tmp/iw/heavy.lock timeout 900 .venv/bin/python benchmarks/rule_eval_vs_prometheus.py [--write]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alert_rules.engine import RuleEngine, load_groups
from alert_rules.store import SeriesStore
from benchmarks._common import machine, publish, revision
from benchmarks.rule_eval import build_store, rule_document, selected_families

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def openmetrics(store: SeriesStore, names: list[str], path: Path) -> int:
    """Write every stored series of these names as OpenMetrics text (times in seconds); returns samples."""
    count = 0
    with path.open("w") as out:
        for name in names:
            for series in store.series(name, []):
                labels = ",".join(f'{k}="{v}"' for k, v in series.labels if k != "__name__")
                head = f"{name}{{{labels}}} "
                out.writelines(f"{head}{v!r} {t / 1000:.3f}\n" for t, v in zip(series.ts, series.vs, strict=True))
                count += len(series.ts)
        out.write("# EOF\n")
    return count


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str) -> Any:
    """GET a Prometheus API URL."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def prometheus_durations(data_dir: Path, rules: Path, evaluations: int, interval_s: int) -> tuple[list[float], int]:
    """Prometheus on ``data_dir`` evaluating ``rules``: per evaluation, the summed group evaluation time (ms),
    and the number of rule evaluation failures it reported."""
    port = free_port()
    config = data_dir.parent / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": f"{interval_s}s"},
                                      "rule_files": [str(rules)]}))
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("Prometheus did not become ready") from None
                time.sleep(0.5)
        # what Prometheus reads: the backfilled series must be there, or the timing would be of empty selections
        visible = get_json(f"{base}/api/v1/query?query=count(%7B__name__%3D~%22inferwatch_.%2B%7Cvllm.%2B%22%7D)")
        count = int(float(visible["data"]["result"][0]["value"][1])) if visible["data"]["result"] else 0
        print(f"Prometheus sees {count} raw series")
        seen: dict[str, str] = {}
        sums: list[float] = []
        failures = 0
        while len(sums) <= evaluations:  # the first evaluation (cold caches) is left out
            time.sleep(interval_s / 2)
            groups = get_json(f"{base}/api/v1/rules")["data"]["groups"]
            stamps = {g["name"]: g["lastEvaluation"] for g in groups}
            if any(stamps[name] == seen.get(name) or stamps[name].startswith("0001") for name in stamps):
                continue  # wait until every group has evaluated again
            seen = stamps
            sums.append(sum(g["evaluationTime"] for g in groups) * 1000)
            failures += sum(1 for g in groups for r in g["rules"] if r.get("health") == "err")
        return sums[1:], failures
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> int:
    """Run both sides; print the figures and, with --write, put them in BENCHMARKS.md."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=2_000, help="active series to generate")
    parser.add_argument("--hours", type=float, default=0.5, help="hours of 5 s samples per series")
    parser.add_argument("--evaluations", type=int, default=7, help="timed evaluations per side (median reported)")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args()
    doc = rule_document()
    interval_s = 15
    end_ms = int(time.time()) // 5 * 5000 - 5000
    store, live = build_store(args.series, args.hours, end_ms)
    raw_series = len(live)
    names = [name for name, _ in selected_families(doc)]
    with tempfile.TemporaryDirectory(prefix="iw-rule-bench-") as tmp:
        root = Path(tmp)
        rules = root / "rules.yml"
        rules.write_text(yaml.safe_dump(doc, sort_keys=False))
        check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, check=False)
        if check.returncode:
            raise SystemExit(f"promtool refuses the rule file:\n{check.stdout}{check.stderr}")
        samples = openmetrics(store, names, root / "series.om")
        started = time.perf_counter()
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(root / "series.om"),
                        str(root / "data")], check=True, capture_output=True)
        backfill_s = time.perf_counter() - started
        (root / "series.om").unlink()
        engine = RuleEngine(load_groups(doc), store, default_interval_ms=interval_s * 1000,
                            recorded_retention_ms=4 * 86_400_000)
        ours: list[float] = []
        errors: list[str] = []
        for i in range(args.evaluations + 1):
            gc.collect()
            gc.disable()
            began = time.perf_counter()
            result = engine.evaluate_all(end_ms + i * interval_s * 1000)
            ours.append((time.perf_counter() - began) * 1000)
            gc.enable()
            errors.extend(result.errors)
        ours = ours[1:]  # the first evaluation creates the recorded series
        theirs, failures = prometheus_durations(root / "data", rules, args.evaluations, interval_s)
        shutil.rmtree(root / "data", ignore_errors=True)
    if errors or failures:
        print(f"evaluation errors: embedded {errors[:3]}, Prometheus rules in error: {failures}")
    rule_count = sum(len(g["rules"]) for g in doc["groups"])
    median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
    body = (
        f"One evaluation of the project's {rule_count} rules ({len(doc['groups'])} groups, "
        "`alert_rules.render.rule_groups(RulesConfig(), DEFAULT_LENGTH_EDGES)`) over the same "
        f"{raw_series:,} series ({samples:,} samples: {args.hours:g} h of 5 s samples, "
        "`benchmarks/rule_eval.py`'s generator), embedded engine against Prometheus 2.42 "
        f"(backfilled with `promtool tsdb create-blocks-from openmetrics` in {backfill_s:.1f} s). "
        "Prometheus: the sum over groups of `evaluationTime` (`/api/v1/rules`), its groups running "
        "concurrently; embedded: `evaluate_all`, one thread. Medians of "
        f"{args.evaluations} evaluations after a first one.\n\n"
        "| figure | value |\n|---|---|\n"
        f"| embedded engine, median (min / max) | **{median_ours:.1f} ms** ({min(ours):.1f} / {max(ours):.1f} ms) |\n"
        f"| Prometheus 2.42, median (min / max) | **{median_theirs:.1f} ms** "
        f"({min(theirs):.1f} / {max(theirs):.1f} ms) |\n"
        f"| ratio embedded / Prometheus | **{median_ours / median_theirs:.2f}** |\n\n"
        f"Command: `flock /tmp/iw/heavy.lock timeout 900 .venv/bin/python benchmarks/rule_eval_vs_prometheus.py "
        f"--series {args.series} --hours {args.hours:g} --evaluations {args.evaluations} --write` "
        f"at {revision()} on {machine()}.\n"
    )
    publish("Rule evaluation against Prometheus 2.42", body, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
