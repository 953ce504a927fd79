"""What usage and cost by tenant costs: the request path's one call, the observer, the repeat-prompt memory.

Times ``Tenancy.tag`` plus ``Tenancy.key_prompt`` (on the request path: the tenant header, the
request class, a salted blake2b of the model and prompt), and ``UsageAccounting.observe`` (an
observer, after the answer: the tenant label, the pool, the GPU-seconds over a timeline of 2,000
steps, the cost, the repeat check, the tables, the ledger) over 200 tenants, and measures with
tracemalloc the bytes per remembered prompt hash of the repeat estimate (``cost.repeat_max_entries``).

    .venv/bin/python benchmarks/usage_accounting.py [--calls 50000] [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, publish, revision
from exporters.cost import CostConfig
from exporters.engine_stats_wire import EngineRequestStats
from exporters.gpu_seconds import BatchTimeline
from exporters.records import RequestRecord
from exporters.repeats import RepeatPrompts
from exporters.usage import UsageAccounting
from serving.config import ServeConfig
from serving.tenancy import Tenancy

ENTRIES = 100_000


def _record(i: int) -> RequestRecord:
    engine = EngineRequestStats(f"cmpl-{i}", 0.01, 0.02, 0.5, 0.52, 0.53, 0, 32, 120, 40, "length")
    return RequestRecord(trace_id=f"{i:032x}", span_id=f"{i:016x}", route="/v1/chat/completions", model="m",
                         tenant=f"tenant-{i % 200}", prompt_tokens=120, completion_tokens=40, start_unix=1000.0 + i,
                         e2e_s=0.6, engine=engine, repeat_key=random.getrandbits(64))


def _per_call_us(run: object, calls: int, rounds: int) -> list[float]:
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        run(calls)  # type: ignore[operator]
        results.append((time.perf_counter() - start) / calls * 1e6)
    return results


def _us(results: list[float]) -> str:
    return f"{statistics.median(results):.2f} µs | {max(results):.2f} µs"


def main() -> None:
    """Measure and print (or write) the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="Update BENCHMARKS.md.")
    args = parser.parse_args()

    tenancy = Tenancy(ServeConfig(), CostConfig())
    headers = CIMultiDict({"x-tenant": "tenant-7", "content-type": "application/json"})
    payload = {"model": "m", "messages": [{"role": "user", "content": "tell me about water " * 20}]}

    def tag(calls: int) -> None:
        for _ in range(calls):
            record = RequestRecord(trace_id="", span_id="", route="/v1/chat/completions")
            tenancy.tag(headers, record)
            tenancy.key_prompt(payload, "m", record)

    timeline = BatchTimeline()
    for step in range(2_000):
        timeline.add(1000.0 + step * 0.1, 1 + step % 8)
    usage = UsageAccounting(CostConfig(gpu_hour_prices={"*": 2.5}), 64, 3600, timeline=timeline)
    records = [_record(i) for i in range(args.calls)]

    def observe(calls: int) -> None:
        for record in records[:calls]:
            usage.observe(record)

    tagged = _per_call_us(tag, args.calls, args.rounds)
    observed = _per_call_us(observe, args.calls, args.rounds)

    repeats = RepeatPrompts(900.0, ENTRIES)
    keys = [random.getrandbits(64) for _ in range(ENTRIES)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i, key in enumerate(keys):
        repeats.seen(key, i * 0.001, answered=True)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_entry = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / ENTRIES

    body = f"""Revision {revision()}, {machine()}. `.venv/bin/python benchmarks/usage_accounting.py --write`

| measurement | median | worst of {args.rounds} rounds of {args.calls:,} calls |
|---|---|---|
| request path: `Tenancy.tag` + `key_prompt` (a 400-character prompt) | {_us(tagged)} |
| observer: `UsageAccounting.observe` (200 tenants, 2,000-step timeline, ledger) | {_us(observed)} |

Repeat-prompt memory: {per_entry:.0f} bytes per remembered prompt hash (measured over {ENTRIES:,}), so the default
`cost.repeat_max_entries` of 100,000 holds {per_entry * ENTRIES / 2**20:.1f} MiB at most; the record's own
`repeat_key` is one int."""
    publish("Usage and cost by tenant", body, args.write)


if __name__ == "__main__":
    main()
