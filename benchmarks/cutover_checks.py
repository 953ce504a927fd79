"""What the release-day checks cost a request: the describer on the request path, the observer at its end.

The proxy calls the describer (serving/cutover.py ``request_describer``) once a generation request's body is
decoded: the client header, the requested model and the prompt's text class (exporters/text_class.py: ASCII
text is not scanned, other text is counted by its UTF-8 lead bytes) of the prompt's text pieces, which the proxy
reads once for every reader (``prompt_strings``, timed here with the describer). The cut-over observer runs once per
finished request: the wrong-model decision, the tokenizer fingerprint lookup and two counters. Both are
timed per call on prompts of several kinds and sizes (median of rounds).

    .venv/bin/python benchmarks/cutover_checks.py [--calls 2000] [--rounds 5] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.trace import INVALID_SPAN
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, publish, revision
from exporters.records import RequestRecord
from serving.config import defaults
from serving.cutover import CutoverWatch, request_describer
from serving.proxy import prompt_strings

PROMPTS: dict[str, dict[str, Any]] = {
    "English chat, 2,000 characters": {"model": "m", "messages": [{"role": "user", "content": "hello world " * 167}]},
    "English prompt, 100,000 characters": {"model": "m", "prompt": "hello world " * 8334},
    "Japanese prompt, 2,000 characters": {"model": "m", "prompt": "東京は日本の首都です。" * 182},
    "emoji-dense prompt, 20 emoji in 80 characters": {"model": "m", "prompt": "Say 😀😃😄😁😆 back " * 4},
    "mixed prompt, 20,000 characters (a tenth emoji and CJK)": {
        "model": "m", "prompt": ("The weather in 東京 is fine 😀 today, " * 570)[:20000]},
}


def per_call_us(call: Callable[[], None], calls: int, rounds: int) -> float:
    """Median over rounds of the mean time per call, in microseconds."""
    results = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        results.append((time.perf_counter_ns() - start) / calls / 1000)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="Calls timed per round (default 2,000).")
    parser.add_argument("--rounds", type=int, default=5, help="Rounds (default 5).")
    parser.add_argument("--write", action="store_true", help="Write the section into BENCHMARKS.md.")
    args = parser.parse_args()
    serve = defaults().serve
    describe = request_describer(serve)
    headers = {"User-Agent": "python-requests/2.31"}
    rows = []
    for name, payload in PROMPTS.items():
        record = RequestRecord("0" * 32, "0" * 16, "/v1/chat/completions")

        def describe_call(r: RequestRecord = record, p: dict[str, Any] = payload) -> None:
            describe(r, headers, p, prompt_strings(p))  # the proxy's one walk of the prompt, then the describer

        rows.append((name, per_call_us(describe_call, args.calls, args.rounds),
                     record.text_class))
    watch = CutoverWatch(serve, CollectorRegistry(), lambda: None)  # type: ignore[arg-type,return-value]
    record = RequestRecord("0" * 32, "0" * 16, "/v1/chat/completions", model="m", requested_model="m",
                           response_model="m")
    observe_us = per_call_us(lambda: watch.observe(record, INVALID_SPAN, generation=True), args.calls * 10,
                             args.rounds)
    lines = [
        f"Revision {revision()}, {machine()}. `.venv/bin/python benchmarks/cutover_checks.py --write`",
        "",
        "| request (its prompt) | describer per request | text class |",
        "|---|---|---|",
        *(f"| {name} | {us:.1f} µs | {cls} |" for name, us, cls in rows),
        "",
        f"The cut-over observer at a request's end (wrong-model decision, fingerprint lookup, two counters): "
        f"{observe_us:.1f} µs. ASCII text costs one isascii() whatever its length; other text is encoded to "
        "UTF-8 once and counted by lead bytes in C, plus a Python step per emoji (the mixed prompt holds 570).",
    ]
    publish("Release day: the cost of the cut-over checks", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
