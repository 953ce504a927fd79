"""Latency and throughput added by `inferwatch serve`, against a fast fake OpenAI upstream.

The fake upstream (tests/fakes/openai_upstream.py) runs in its own process and streams N tokens
with no delay. The same requests go directly to it and through a real `inferwatch serve`
subprocess, alternating round by round, at each concurrency. Reports p50/p99 of TTFT and e2e
(sidecar minus direct) and the throughput ratio (through the sidecar / direct).

    .venv/bin/python benchmarks/proxy_overhead.py [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, percentile, publish, revision
from serving.tools.launcher import free_port, start_sidecar

TOKENS = 64


def _run_fake(port: int, token_delay_s: float) -> None:
    from aiohttp import web

    from tests.fakes.openai_upstream import FakeOpenAI

    fake = FakeOpenAI(token_delay_s=token_delay_s, record=False)
    web.run_app(fake.app(), host="127.0.0.1", port=port, print=None, access_log=None)


@dataclass
class Round:
    """Timings of one round of requests."""

    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    wall: float = 0.0
    errors: int = 0


async def _one(session: aiohttp.ClientSession, url: str, stream: bool, out: Round) -> None:
    body = {"model": "fake-model", "prompt": "benchmark", "max_tokens": TOKENS, "stream": stream}
    start = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            out.errors += 1
        if stream:
            async for _line in response.content:
                if ttft is None:
                    ttft = time.perf_counter() - start
        else:
            await response.read()
            ttft = time.perf_counter() - start
    out.e2e.append(time.perf_counter() - start)
    out.ttft.append(ttft if ttft is not None else out.e2e[-1])


async def _round(session: aiohttp.ClientSession, url: str, stream: bool, concurrency: int, total: int) -> Round:
    out = Round()
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            await _one(session, url, stream, out)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.wall = time.perf_counter() - start
    return out


async def _measure(
    direct: str, sidecar: str, concurrency: int, stream: bool, total: int, rounds: int
) -> dict[str, Round]:
    connector = aiohttp.TCPConnector(limit=0)
    results = {"direct": Round(), "sidecar": Round()}
    async with aiohttp.ClientSession(connector=connector) as session:
        for url in (direct, sidecar):  # warm-up: connections, code paths
            await _round(session, url, stream, concurrency, concurrency * 2)
        for _ in range(rounds):
            for name, url in (("direct", direct), ("sidecar", sidecar)):
                r = await _round(session, url, stream, concurrency, total // rounds)
                agg = results[name]
                agg.ttft += r.ttft
                agg.e2e += r.e2e
                agg.wall += r.wall
                agg.errors += r.errors
    return results


def _table(rows: list[dict[str, Any]]) -> list[str]:
    table = [
        "| concurrency | mode | requests/side | added TTFT p50 | added TTFT p99 | added e2e p50 | added e2e p99 "
        "| direct req/s | sidecar req/s | throughput ratio | sidecar CPU/request | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['concurrency']} | {r['mode']} | {r['requests']} | {r['ttft_p50_ms']:.2f} ms "
            f"| {r['ttft_p99_ms']:.2f} ms | {r['e2e_p50_ms']:.2f} ms | {r['e2e_p99_ms']:.2f} ms "
            f"| {r['direct_rps']:.0f} | {r['sidecar_rps']:.0f} | {r['ratio']:.2f} | {r['cpu_ms']:.2f} ms "
            f"| {r['errors']} |"
        )
    return table


def _verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Each target of the issue, met or missed, from the unpaced rows."""
    out = ["Against the targets (unpaced, as specified):", ""]
    for r in rows:
        if r["concurrency"] == 16:
            ok = r["e2e_p50_ms"] <= 1 and r["e2e_p99_ms"] <= 5
            out.append(f"- concurrency 16, {r['mode']}: added e2e p50 {r['e2e_p50_ms']:.2f} ms (target <= 1), "
                       f"p99 {r['e2e_p99_ms']:.2f} ms (target <= 5): {'met' if ok else 'missed'}.")
        if r["concurrency"] == 128:
            out.append(f"- concurrency 128, {r['mode']}: throughput ratio {r['ratio']:.2f} (target >= 0.8): "
                       f"{'met' if r['ratio'] >= 0.8 else 'missed'}.")
    c16 = {r["mode"]: r for r in rows if r["concurrency"] == 16}
    stream, plain = c16.get("stream 64 tok"), c16.get("non-stream 64 tok")
    if stream and plain:
        out += [
            "",
            f"Why: in this run the sidecar spent {stream['cpu_ms']:.2f} ms of CPU per 64-token streamed request "
            f"and {plain['cpu_ms']:.2f} ms per non-streamed one (concurrency 16). With a zero-delay upstream on 2 "
            "shared cores that CPU is taken from the client and the upstream, so it shows up as queueing, not as "
            "the sidecar's own latency; the peer comparison (\"Proxy cost against peers\") splits it per request "
            "and per chunk.",
        ]
    return out


def _run(token_delay_s: float, plan: list[tuple[int, int]], scale: float) -> list[dict[str, Any]]:
    """Start a fake upstream (paced at ``token_delay_s`` per token) and a sidecar; measure each plan row."""
    fake_port = free_port()
    fake = multiprocessing.Process(target=_run_fake, args=(fake_port, token_delay_s), daemon=True)
    fake.start()
    rows = []
    sidecar = start_sidecar(f"http://127.0.0.1:{fake_port}", Path(tempfile.mkdtemp(prefix="inferwatch-bench-")),
                            ["--gpu-enabled", "false"], ready_path="/readyz")
    proc = psutil.Process(sidecar.pid)
    paced = f", paced {token_delay_s * 1e3:g} ms/token" if token_delay_s else ""
    try:
        direct, through = f"http://127.0.0.1:{fake_port}", sidecar.base_url
        for concurrency, total in plan:
            for stream in (True, False):
                n = max(int(total * scale), concurrency * 4)
                cpu_before = sum(proc.cpu_times()[:2])
                res = asyncio.run(_measure(direct, through, concurrency, stream, n, rounds=4))
                cpu = sum(proc.cpu_times()[:2]) - cpu_before
                d, s = res["direct"], res["sidecar"]
                row = {
                    "concurrency": concurrency,
                    "mode": ("stream 64 tok" if stream else "non-stream 64 tok") + paced,
                    "requests": len(s.e2e),
                    "ttft_p50_ms": (percentile(s.ttft, .5) - percentile(d.ttft, .5)) * 1e3,
                    "ttft_p99_ms": (percentile(s.ttft, .99) - percentile(d.ttft, .99)) * 1e3,
                    "e2e_p50_ms": (percentile(s.e2e, .5) - percentile(d.e2e, .5)) * 1e3,
                    "e2e_p99_ms": (percentile(s.e2e, .99) - percentile(d.e2e, .99)) * 1e3,
                    "direct_rps": len(d.e2e) / d.wall, "sidecar_rps": len(s.e2e) / s.wall,
                    # warm-up requests included: an upper bound of the sidecar's CPU per request
                    "cpu_ms": cpu * 1e3 / (len(s.e2e) + 2 * concurrency),
                    "errors": d.errors + s.errors,
                }
                row["ratio"] = row["sidecar_rps"] / row["direct_rps"]
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    finally:
        sidecar.stop()
        fake.terminate()
    return rows


def main() -> int:
    """Run the benchmark and print (and with --write, record) the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the tables into BENCHMARKS.md")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the request counts")
    args = parser.parse_args()
    unpaced = _run(0.0, [(1, 200), (16, 1600), (128, 2560)], args.scale)
    paced = _run(0.005, [(16, 320), (128, 1280)], args.scale)
    text = "\n".join([
        f"Command: `.venv/bin/python benchmarks/proxy_overhead.py --write` (revision {revision()}, {machine()}).",
        "",
        *_verdict(unpaced),
        "",
        "Client, fake upstream and sidecar are three processes sharing the machine's 2 cores; direct and "
        "sidecar rounds alternate (4 rounds each) after a warm-up. Targets: added p50 <= 1 ms and p99 <= 5 ms "
        "at concurrency 16; throughput ratio >= 0.8 at concurrency 128. \"Sidecar CPU/request\" is the "
        "sidecar process's user+system CPU time over its rounds, divided by the requests it served.",
        "",
        "**As specified: the fake upstream streams with no delay.** Every process is CPU-bound here, so the "
        "sidecar's own CPU per request sets both the throughput ratio and, through queueing on the shared "
        "cores, the added latency at concurrency 16 and 128.",
        "",
        *_table(unpaced),
        "",
        "**For context: the fake upstream paced at 5 ms per token** (a fast GPU's decode speed), so the "
        "upstream, not the CPU, sets the pace, as in production.",
        "",
        *_table(paced),
    ])
    publish("Proxy overhead", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
