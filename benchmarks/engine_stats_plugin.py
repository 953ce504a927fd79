"""What inferwatch's stat-logger plugin costs vLLM: throughput with and without it, in one run.

Two real vLLM-CPU servers on the tiny model run side by side, both with the plugin installed: one with
it sending to a UDP listener in this process (``INFERWATCH_ENGINE_STATS``), one with it idle (the
variable unset: ``record()`` returns at once). Only the plugin's work differs, not the set of plugins
vLLM loads. Rounds alternate between them (B, A, A, B, ...), each
a closed loop of ``--concurrency`` streams of ``--max-tokens`` tokens; throughput is generated
tokens per second, compared as the median of the rounds' ratios (each round's pair runs back to back),
with a distribution-free interval for that median: the resolution the run gives, against the goal of
at most 1 %. The plugin's own cost per call of ``record()`` is timed too, inside vLLM's interpreter
on vLLM's own stats classes, and set against the request rate measured here: the share of the API
server's time it can take.

    make setup
    .venv/bin/python benchmarks/engine_stats_plugin.py [--rounds 6] [--write]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import math
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, percentile, publish, revision
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


GOAL = 0.99
"""Throughput with the plugin sending, as a share of idle, that the goal allows (a cost of at most 1 %)."""
CONFIDENCE = 0.95


def _plugin_step_interval_s() -> float:
    """``STEP_INTERVAL_S`` of exporters/vllm_plugin.py, read from its source (importing it needs vLLM)."""
    tree = ast.parse((ROOT / "exporters" / "vllm_plugin.py").read_text())
    return next(float(ast.literal_eval(node.value)) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "STEP_INTERVAL_S" for t in node.targets))


STEPS_PER_S_IDLE = 1 / _plugin_step_interval_s()
"""Datagrams a second the plugin sends for steps with nothing finished (its own limit)."""


@dataclass(frozen=True)
class Run:
    """How the rounds were run (for the section's command and description)."""

    command: str
    rounds: int
    requests: int
    max_tokens: int
    concurrency: int
    revision: str
    machine: str


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median: the k-th smallest and k-th largest of ``values``, with k the
    largest for which the interval still covers the median with at least ``confidence`` (binomial order
    statistics); returns (low, high, its coverage), or None when there are too few values for ``confidence``."""
    ordered, n = sorted(values), len(values)
    best = None
    for k in range(1, n // 2 + 1):
        # P(median outside) = 2 * P(Binomial(n, 1/2) < k)
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
        if coverage < confidence:
            break
        best = (ordered[k - 1], ordered[n - k], coverage)
    return best


def throughput_verdict(ratios: list[float], goal: float = GOAL) -> tuple[str, str]:
    """The throughput goal ``met``, ``missed`` or ``not resolved`` by the rounds' paired ratios, and why in words
    (the median's interval, which is the resolution this run gives)."""
    interval = median_interval(ratios)
    if interval is None:
        return "not resolved", (f"{len(ratios)} rounds are too few for a {CONFIDENCE:.0%} interval of the median "
                                "ratio")
    low, high, coverage = interval
    span = (f"the median ratio's {coverage:.1%} interval from the rounds' ordered ratios is "
            f"[{low:.3f}, {high:.3f}]")
    if low >= goal:
        return "met", f"{span}, all of it at or above {goal:g}"
    if high < goal:
        return "missed", f"{span}, all of it below {goal:g}"
    width = (high - low) * 100
    return "not resolved", (
        f"{span}, {width:.1f} points wide: this run resolves a difference of about ±{width / 2:.1f} %, not the "
        f"goal's {(1 - goal) * 100:g} %; what it can say is that the plugin costs at most "
        f"{max(1 - low, 0) * 100:.1f} % of vLLM's throughput")


def timed_share(cost: dict[int, float], requests_per_s: float) -> float:
    """The share of one core ``record()`` takes at ``requests_per_s`` (each finished request sending a datagram of
    its own, steps with nothing finished STEPS_PER_S_IDLE a second), from its timed cost per call (µs)."""
    return (requests_per_s * cost[1] + STEPS_PER_S_IDLE * cost[0]) * 1e-6


def report(run: Run, with_plugin: list[float], without: list[float], cost: dict[int, float], datagrams: int) -> str:
    """The BENCHMARKS.md section, from the rounds' tokens per second (each pair run back to back) and the timed
    cost of one ``record()`` call with 0, 1 and 8 finished requests (µs)."""
    # each round's pair ran back to back: their ratio is free of the drift between rounds
    ratios = [a / b for a, b in zip(with_plugin, without, strict=True)]
    ratio = percentile(ratios, 0.5)
    spread = {name: max(rounds) / min(rounds) - 1 for name, rounds in (("with", with_plugin), ("idle", without))}
    requests_per_s = percentile(with_plugin, 0.5) / run.max_tokens
    share = timed_share(cost, requests_per_s)
    by_throughput, why = throughput_verdict(ratios)
    by_timing = "met" if share <= 1 - GOAL else "missed"
    overall = by_throughput if by_throughput != "not resolved" else f"{by_timing}, by the timed cost alone"
    return f"""Command: `{run.command}` \
(revision {run.revision}, {run.machine}); two real vLLM-CPU 0.32 servers on the tiny model side by side, one with \
the plugin sending to a UDP listener, one with it idle (`INFERWATCH_ENGINE_STATS` unset), rounds alternating, \
{run.requests} requests of {run.max_tokens} tokens per round at concurrency {run.concurrency}.

Goal: the plugin costs at most 1 % of vLLM's throughput (with it sending, {GOAL:g}x of idle or more): \
**{overall}**.

- By throughput: **{by_throughput}**; {why}.
- By the plugin's own timed work: **{by_timing}**; {share * 100:.3f} % of one core at the request rate \
measured here (below), the throughput it could take if every microsecond of it came out of vLLM's.

| server | median tokens/s | rounds |
|---|---:|---|
| with the plugin | {percentile(with_plugin, 0.5):.0f} | {", ".join(f"{x:.0f}" for x in with_plugin)} |
| plugin idle | {percentile(without, 0.5):.0f} | {", ".join(f"{x:.0f}" for x in without)} |

Throughput with the plugin sending: **{ratio:.3f}x** of idle ({(ratio - 1) * 100:+.1f} %), the median of the \
{len(ratios)} rounds' ratios (each round runs both servers back to back: {", ".join(f"{x:.2f}" for x in ratios)}). \
The two servers are two processes throughout: alternating rounds takes out the machine's drift over time, not a \
difference between the two processes themselves. The rounds of one server alone spread by \
{spread["with"] * 100:.1f} % (with the plugin) and \
{spread["idle"] * 100:.1f} % (idle). The plugin received {datagrams} datagrams.

The plugin's own work, timed inside vLLM's interpreter on vLLM's own stats classes (one `record()` call \
sending the scheduler state and the step's finished requests over UDP, the machine busy with the two \
servers' idle loops): {cost[0]:.1f} µs with none finished, {cost[1]:.1f} µs with one, {cost[8]:.1f} µs with \
eight. At the {requests_per_s:.1f} requests per second measured here, with every finished request sending a \
datagram of its own and steps with nothing finished sending {STEPS_PER_S_IDLE:g} a second (its limit), that is \
{share * 100:.3f} % of one core of vLLM's API server, where the plugin runs.
"""


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
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/engine_stats_plugin.py", *given])
    body = report(Run(command, args.rounds, args.requests, args.max_tokens, args.concurrency, revision(), machine()),
                  results["with plugin"], results["without"], cost, discard.datagrams)
    publish(SECTION, body, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
