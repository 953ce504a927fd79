"""What keeping every finished request for ``inferwatch explain`` costs: time on the request path, memory.

The sidecar's ring (serving/explain.py, ``serve.explain_ring_size``) keeps a reference to each
request's record as the proxy finished it. This times the observer the app runs for it
(``observe_for_explain``: the call, a deque append, a dict store and, on a full ring, forgetting
the oldest), on a full ring of the default 10,000 entries, and measures with tracemalloc what the
ring holds per entry: the record it keeps alive (trace and span ids, the model and route, its
engine numbers from the plugin, its gaps between tokens, one double each in an array) and the ring's own
slot and index entry, for a non-streamed answer and for streams of 100 and 1,000 tokens.

    .venv/bin/python benchmarks/explain_ring.py [--calls 200000] [--rounds 7] [--write]
"""

from __future__ import annotations

import argparse
import gc
import random
import secrets
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

from opentelemetry.trace import INVALID_SPAN, Span

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks._common import machine, publish, revision
from exporters.engine_stats_wire import EngineRequestStats
from exporters.records import Outcome, RequestRecord
from serving.explain import RequestRing

RING_SIZE = 10_000
MEASURED_ENTRIES = 2_000
"""Entries whose memory is measured (a full ring of 1,000-token streams would hold 300 MiB for the measure)."""


def record(tokens: int) -> RequestRecord:
    """A request record as the proxy finishes one: every field it fills set, ``tokens`` gaps when streamed."""
    trace_id = secrets.token_hex(16)
    rnd = random.random
    return RequestRecord(
        trace_id=trace_id, span_id=secrets.token_hex(8), route="/v1/chat/completions", model="tiny-llm",
        stream=tokens > 0, upstream="http://127.0.0.1:8000", http_status=200, outcome=Outcome.OK,
        length_bucket="le512", prompt_tokens=130, completion_tokens=max(tokens, 16), accept_s=rnd(),
        upstream_sent_s=rnd(), connect_s=0.0, ttft_s=rnd(), e2e_s=rnd(),
        inter_token_s=array("d", [rnd() for _ in range(tokens)]),
        finish_reason="length", response_model="tiny-llm", start_unix=time.time() + rnd(),
        prompt_tokens_estimate=128, client_wait_s=0.0,
        engine=EngineRequestStats(f"chatcmpl-{trace_id}-0-1a2b3c4d", rnd(), rnd(), rnd(), rnd(), rnd(), 0, 32,
                                  130, max(tokens, 16), "length"),
    )


def bytes_per_entry(tokens: int) -> float:
    """Bytes tracemalloc sees held by a full ring, per entry (records built and kept only by the ring)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ring = RequestRing(MEASURED_ENTRIES)
    for _ in range(MEASURED_ENTRIES):
        ring.add(record(tokens))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del ring
    return held / MEASURED_ENTRIES


def add_cost_ns(calls: int, rounds_wanted: int) -> list[float]:
    """ns per observer call on a full ring, one figure per round."""
    ring = RequestRing(RING_SIZE)

    def observe_for_explain(record: RequestRecord, _span: Span) -> None:  # as serving/app.py has it
        ring.add(record)

    records = [record(0) for _ in range(3 * RING_SIZE)]
    for item in records[:RING_SIZE]:
        observe_for_explain(item, INVALID_SPAN)
    rounds = []
    n = len(records)
    for _ in range(rounds_wanted):
        began = time.perf_counter_ns()
        for i in range(calls):
            observe_for_explain(records[i % n], INVALID_SPAN)
        rounds.append((time.perf_counter_ns() - began) / calls)
    loop = []  # the loop and the indexing alone, to take out
    for _ in range(rounds_wanted):
        began = time.perf_counter_ns()
        for i in range(calls):
            records[i % n]  # the same indexing as above, without the call
        loop.append((time.perf_counter_ns() - began) / calls)
    floor = statistics.median(loop)
    return [r - floor for r in rounds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000, help="Calls timed per round (default 200,000).")
    parser.add_argument("--rounds", type=int, default=7, help="Rounds (default 7).")
    parser.add_argument("--write", action="store_true", help="Write the section into BENCHMARKS.md.")
    args = parser.parse_args()
    costs = add_cost_ns(args.calls, args.rounds)
    sizes = {tokens: bytes_per_entry(tokens) for tokens in (0, 100, 1000)}
    lines = [
        f"Revision {revision()}, {machine()}. `.venv/bin/python benchmarks/explain_ring.py --write`",
        "",
        f"Recording a finished request in the ring of {RING_SIZE:,} (full, so each call also forgets the oldest), "
        "as the sidecar's observer does it, the loop's own cost taken out: "
        f"median {statistics.median(costs) / 1000:.2f} µs, worst of {args.rounds} rounds of {args.calls:,} calls "
        f"{max(costs) / 1000:.2f} µs (the goal: at most 2 µs). Nothing else is computed until someone asks.",
        "",
        f"| request | bytes per ring entry (measured over {MEASURED_ENTRIES:,}) | a full ring of {RING_SIZE:,} |",
        "|---|---|---|",
    ]
    for tokens, size in sizes.items():
        kind = "non-streamed" if tokens == 0 else f"stream of {tokens:,} tokens"
        lines.append(f"| {kind} | {size:,.0f} | {size * RING_SIZE / 2**20:,.1f} MiB |")
    lines += ["", "An entry is the request's record the proxy built anyway, kept alive: its gaps between tokens "
              "(one double each in an array, 8 bytes a token, as serving/proxy.py keeps them) dominate for long "
              "streams; `serve.explain_ring_size` bounds the total."]
    publish("Explain: the ring of recent requests", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
