"""The upstream's CPU per request with the sidecar in front against direct, both at the same request rate.

"Proxy cost against peers" drives every path as fast as it goes (a closed loop): behind a proxy the
upstream serves fewer requests a second, each wake-up of its process handles fewer of them, and its
CPU per request rises whatever the proxy sends it (behind nginx as well). That mixes two things: the
work the sidecar asks of the upstream (extra calls, extra bytes, per-chunk usage) and how busy the
proxy leaves it. Here both paths get the same open-loop rate, low enough that neither path is the
bottleneck, so the upstream wakes up alike on both. Twice: with every process free to run on every
core, where the sidecar's path has one more busy process sharing the upstream's cores, and with the
upstream on a core of its own (the client and the sidecar on the others), where what is left between
the paths is the work asked of the upstream. The shared bench's fake upstream (aiohttp, as vLLM's
API server is), unpaced, answers non-streamed chat requests and 64-chunk streams; ``inferwatch serve``
runs at its defaults. Rounds alternate the paths; the upstream's CPU is read from
``/proc/PID/task/*/schedstat`` (nanoseconds on the CPU, every thread).

    .venv/bin/python benchmarks/upstream_cost.py [--rounds 4] [--seconds 8] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, interrupt_all, machine, percentile, publish, revision
from benchmarks.proxy_profile import BENCH, CHAT_BODY, wait_ready
from serving.tools.launcher import free_port

SECTION = "The upstream's CPU at the same request rate"
KINDS = {"non-streamed": (False, 200.0), "streamed, 64 chunks": (True, 50.0)}
"""Each kind of request: (streamed, requests a second on both paths)."""


PLACEMENTS = ("shared", "own core")
"""Where the processes run: all on every core, or the upstream on core 0 and the rest on the others."""


def pin(pid: int, cpus: set[int]) -> None:
    """Let every thread of process ``pid`` run only on ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):  # a thread that ended between the listing and the call
            continue


def place(placement: str, upstream: int, others: list[int]) -> None:
    """Put the upstream and the other processes (the sidecar, this client) where ``placement`` says."""
    every = set(range(os.cpu_count() or 1))
    pin(upstream, every if placement == "shared" else {0})
    for pid in others:
        pin(pid, every if placement == "shared" else every - {0})


def cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU so far, every thread (the scheduler's own count)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended between the listing and the read
            continue
    return total


async def open_loop(url: str, stream: bool, rate: float, seconds: float) -> int:
    """Send requests at ``rate`` a second for ``seconds`` whatever the answers' pace; returns how many came back
    whole (status 200, the body read to its end)."""
    body = {**CHAT_BODY, "stream": stream}
    done = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal done
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            await response.read()
            if response.status == 200:
                done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = []
        start = time.perf_counter()
        for number in range(int(rate * seconds)):
            delay = start + number / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session)))
        await asyncio.gather(*tasks)
    return done


def measure(rounds: int, seconds: float) -> dict[tuple[str, str], dict[str, list[float]]]:
    """The upstream's CPU µs per request, by kind and placement, and by path, one figure a round."""
    results = {(kind, placement): {"direct": [], "sidecar": []} for kind in KINDS for placement in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="upstream-cost-") as tmp:
        upstream_port, sidecar_port = free_port(), free_port()
        upstream = subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "serve", "--upstream", f"http://127.0.0.1:{upstream_port}",
             "--listen", f"127.0.0.1:{sidecar_port}", "--logs-dir", str(Path(tmp) / "logs"), "--gpu-enabled",
             "false"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        paths = {"direct": f"http://127.0.0.1:{upstream_port}", "sidecar": f"http://127.0.0.1:{sidecar_port}"}
        try:
            wait_ready(paths["direct"] + "/v1/models")
            wait_ready(paths["sidecar"] + "/healthz")
            for (kind, placement), figures in results.items():
                stream, rate = KINDS[kind]
                place(placement, upstream.pid, [sidecar.pid, os.getpid()])
                for url in paths.values():  # warm-up: connections opened, first-use paths taken
                    asyncio.run(open_loop(url, stream, rate, 1.0))
                for number in range(1, rounds + 1):
                    for path, url in paths.items():
                        before = cpu_ns(upstream.pid)
                        answered = asyncio.run(open_loop(url, stream, rate, seconds))
                        used = cpu_ns(upstream.pid) - before
                        if answered != int(rate * seconds):
                            raise SystemExit(f"upstream_cost: {path} answered {answered} of "
                                             f"{int(rate * seconds)} {kind} requests")
                        figures[path].append(used / answered / 1e3)
                    print(f"upstream_cost: {kind}, {placement}, round {number}/{rounds}: " + ", ".join(
                        f"{path} {figures[path][-1]:.0f} µs" for path in paths), file=sys.stderr, flush=True)
        finally:
            place("shared", upstream.pid, [os.getpid()])
            interrupt_all((sidecar, upstream))
    return results


PLACEMENT_CELLS = {"shared": "every process on every core", "own core": "the upstream on a core of its own"}


def report(results: dict[tuple[str, str], dict[str, list[float]]], rounds: int, seconds: float) -> str:
    """The section: the table, round by round ratios, and what they say."""
    rows, verdicts = [], {placement: [] for placement in PLACEMENTS}
    for (kind, placement), paths in results.items():
        direct, sidecar = percentile(paths["direct"], 0.5), percentile(paths["sidecar"], 0.5)
        ratios = [ours / theirs for ours, theirs in zip(paths["sidecar"], paths["direct"], strict=True)]
        ratio = percentile(ratios, 0.5)
        _, rate = KINDS[kind]
        rows.append(f"| {kind} | {rate:.0f} | {PLACEMENT_CELLS[placement]} | {direct:,.0f} | {sidecar:,.0f} | "
                    f"{ratio:.2f}× | " + ", ".join(f"{r:.2f}" for r in ratios) + " |")
        verdicts[placement].append(f"{kind} {ratio:.2f}× ({'within' if ratio <= 1.10 else 'over'} the issue's "
                                   "1.10×)")
    return "\n".join([
        f"Command: `.venv/bin/python benchmarks/upstream_cost.py --rounds {rounds} --seconds {seconds:g} --write` "
        f"(revision {revision()}, {machine()}); the shared bench's fake upstream, unpaced, direct and through "
        f"`inferwatch serve` at its defaults, the same open-loop rate on both paths, {rounds} rounds of "
        f"{seconds:g} s alternating the paths; the upstream's CPU per request from the scheduler's count "
        "(every thread), medians over the rounds, the ratio the median of the rounds' own ratios:",
        "",
        "| requests | a second | where the processes run | upstream CPU per request, direct (µs) "
        "| through the sidecar (µs) | sidecar / direct | round by round |",
        "|---|---:|---|---:|---:|---:|---|",
        *rows,
        "",
        "With the upstream on a core of its own: " + "; ".join(verdicts["own core"]) + ". With every process on "
        "every core (the sidecar's path has one more busy process on the upstream's cores): "
        + "; ".join(verdicts["shared"]) + ". At its defaults the sidecar sends the request it got with "
        "a traceparent header and `Accept-Encoding: identity` added, asks for the usage chunk a stream ends "
        "with and for nothing on each chunk, and makes no call of its own (`serve.exact_live_token_counts`, "
        "off by default, adds per-chunk usage and a `/tokenize` call per non-streamed request). The sidecar's "
        "calls of its own time (its scrape of the upstream's `/metrics` and its readiness probe, every 5 s by "
        "default) run through both paths' rounds, so they are in both figures. \"Proxy cost "
        "against peers\" drives each path as fast as it goes instead.",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each path once a round (default 4)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds a path is driven a round (default 8)")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        print("upstream_cost: needs two cores at least (the upstream gets one of its own)", file=sys.stderr)
        return 2
    if not BENCH.exists():
        print(f"upstream_cost: {BENCH} is missing (the shared bench)", file=sys.stderr)
        return 2
    publish(SECTION, report(measure(args.rounds, args.seconds), args.rounds, args.seconds), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
