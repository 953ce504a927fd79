"""Realistic request events for the log pipeline benchmarks (fixed seed, our schema).

Shape follows the fact sheet's synthetic gateway corpus (shared/reference/logs-traces.md §1):
five weighted models, lognormal token counts (prompt median ~600, completion ~180), TTFT p50
~75 ms, 2 % errors of six kinds, about 1000 requests/s. Each event is what
``log_pipeline.records.event_from_record`` makes of a ``RequestRecord``.

    python benchmarks/logs_generate.py 200000 > /tmp/records.jsonl
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

from exporters.records import Outcome, RequestRecord, length_bucket
from log_pipeline.records import event_from_record

MODELS = (("meta-llama/Llama-3.1-8B-Instruct", 45), ("Qwen/Qwen2.5-7B-Instruct", 25),
          ("mistralai/Mistral-7B-Instruct-v0.3", 15), ("google/gemma-2-9b-it", 10),
          ("meta-llama/Llama-3.1-70B-Instruct", 5))
ROUTES = (("/v1/chat/completions", 85), ("/v1/completions", 12), ("/v1/embeddings", 3))
ERRORS = (
    (Outcome.CLIENT_ERROR, 400, "BadRequestError", "This model's maximum context length is 8192 tokens."),
    (Outcome.OVERLOADED, 429, "RateLimited", "upstream answered 429: too many requests in the waiting queue"),
    (Outcome.CANCELLED, 499, "ClientDisconnected", "client closed the connection before the response ended"),
    (Outcome.UPSTREAM_ERROR, 500, "UpstreamError", "upstream answered 500: EngineCore encountered an issue"),
    (Outcome.OVERLOADED, 503, "ServiceUnavailable", "upstream answered 503: server is not ready"),
    (Outcome.TIMEOUT, 504, "ReadTimeout", "upstream stalled for more than 300 s between chunks"),
)
SLA_S = 30.0


def _weighted(rng: random.Random, table: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([name for name, _ in table], [w for _, w in table])[0]


def events(n: int, seed: int = 20260807, start_unix: float = 1_785_000_000.0) -> Iterator[dict[str, Any]]:
    """``n`` request events in time order."""
    rng = random.Random(seed)
    now = start_unix
    for _ in range(n):
        now += rng.expovariate(1000.0)
        route = _weighted(rng, ROUTES)
        prompt = max(1, int(rng.lognormvariate(math.log(600), 1.0)))
        completion = 0 if route == "/v1/embeddings" else max(1, min(4096, int(rng.lognormvariate(math.log(180), 0.9))))
        stream = route == "/v1/chat/completions" and rng.random() < 0.7
        ttft = rng.lognormvariate(math.log(0.075), 0.8)
        itl = rng.lognormvariate(math.log(0.025), 0.3)
        e2e = ttft + completion * itl
        record = RequestRecord(
            trace_id=f"{rng.getrandbits(128):032x}", span_id=f"{rng.getrandbits(64):016x}", route=route,
            model=_weighted(rng, MODELS), stream=stream, upstream="http://127.0.0.1:8000", http_status=200,
            length_bucket=length_bucket(prompt), prompt_tokens=prompt, completion_tokens=completion,
            accept_s=ttft * rng.uniform(0.05, 0.6) if stream else e2e, ttft_s=ttft, e2e_s=e2e,
            inter_token_s=[itl] if stream else [],
            finish_reason="length" if completion >= 4096 or rng.random() < 0.08 else "stop",
            start_unix=now - e2e,
        )
        if rng.random() < 0.02:
            outcome, status, kind, message = rng.choice(ERRORS)
            record.outcome, record.http_status, record.error_type, record.error_message = outcome, status, kind, message
            record.completion_tokens, record.finish_reason, record.inter_token_s = None, None, []
            record.ttft_s = None if status != 499 else record.ttft_s
        yield event_from_record(record, sla_s=SLA_S)


def json_lines(n: int, seed: int = 20260807) -> list[bytes]:
    """The events as compact JSON lines (with newline), as ``logs cat`` prints them."""
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return [(encode(e) + "\n").encode() for e in events(n, seed)]


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    sys.stdout.buffer.writelines(json_lines(count))
