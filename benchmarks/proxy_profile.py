"""Where the sidecar's CPU goes, by component: ``inferwatch serve`` under cProfile, driven by a load.

Starts the shared bench's fake upstream (``../shared/tools/peer_proxy_bench.py upstream``, 64
chunks per stream, unpaced), runs ``inferwatch serve`` in front of it under cProfile, sends
streamed and non-streamed requests at concurrency 16, stops the sidecar with SIGINT (cProfile
writes its profile on the clean exit) and sums the profile's own time by the component each
function belongs to. cProfile slows Python code (not C) by a constant factor, so the shares are
the figure to read; the microseconds are profiled time per request, larger than unprofiled.

    .venv/bin/python benchmarks/proxy_profile.py [--requests 3000] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, revision, write_section
from serving.tools.launcher import free_port

BENCH = ROOT.parent / "shared" / "tools" / "peer_proxy_bench.py"
SECTION = "Proxy CPU by component"
COMPONENTS = (  # first match wins: (component, substrings of the function's file path)
    ("SSE reader (serving/sse.py)", ("serving/sse.py",)),
    ("stream relay (serving/stream_relay.py)", ("serving/stream_relay.py",)),
    ("front: the HTTP server of /v1 (serving/front.py, exchange)", ("serving/front.py", "serving/exchange.py")),
    ("proxy request path (serving/proxy.py, admission, body checks)",
     ("serving/proxy.py", "serving/admission.py", "serving/body_checks.py", "serving/errors.py")),
    ("tracing (serving/tracing.py, OpenTelemetry)", ("serving/tracing.py", "opentelemetry")),
    ("metrics (request_metrics, batch_histogram, prometheus_client)",
     ("exporters/request_metrics.py", "exporters/batch_histogram.py", "prometheus_client")),
    ("request log (log_pipeline: event, sampling, sink)", ("log_pipeline",)),
    ("upstream client (serving/upstream_http.py, httptools)", ("serving/upstream_http.py", "httptools")),
    ("other sidecar code (app observers, exporters, structlog)", ("serving/", "exporters/", "structlog")),
    ("aiohttp server (web_*, http parser, streams)", ("aiohttp/web", "aiohttp/http", "aiohttp/streams",
                                                       "aiohttp/base_protocol", "aiohttp/helpers")),
    ("aiohttp client (client_*, connector)", ("aiohttp/client", "aiohttp/connector")),
    ("multidict, yarl", ("multidict", "yarl")),
)
OTHER = "event loop, asyncio and the rest"


def component(path: str, name: str) -> str:
    """The component a profiled function belongs to (built-ins go with the rest)."""
    for label, needles in COMPONENTS:
        if any(needle in path for needle in needles):
            return label
    return OTHER


def wait_ready(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"proxy_profile: {url} not ready within {deadline_s:.0f} s")


async def drive(url: str, stream: bool, requests: int, concurrency: int = 16) -> None:
    body = {"model": "ppb-model", "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
            "max_tokens": 64, "stream": stream}
    left = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in left:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"proxy_profile: the sidecar answered {response.status}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def profile(stream: bool, requests: int, workdir: Path) -> dict[str, float]:
    """Profiled seconds by component over one sidecar process's life serving ``requests`` requests."""
    upstream_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = workdir / f"{'stream' if stream else 'nonstream'}.prof"
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "serving.cli", "serve",
         "--upstream", f"http://127.0.0.1:{upstream_port}", "--listen", f"127.0.0.1:{port}",
         "--logs-dir", str(workdir / "logs"), "--gpu-enabled", "false"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{upstream_port}/v1/models")
        wait_ready(f"http://127.0.0.1:{port}/healthz")
        asyncio.run(drive(f"http://127.0.0.1:{port}", stream, requests))
    finally:
        sidecar.send_signal(signal.SIGINT)
        sidecar.wait(timeout=60)
        upstream.terminate()
        upstream.wait(timeout=10)
    totals: dict[str, float] = defaultdict(float)
    for (path, _line, name), (_cc, _nc, own, _cum, _callers) in pstats.Stats(str(out)).stats.items():  # type: ignore[attr-defined]
        totals[component(path, name)] += own
    return dict(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per mode (default 3000)")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    if not BENCH.exists():
        print(f"proxy_profile: {BENCH} is missing", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="proxy-profile-") as tmp:
        results = {mode: profile(mode == "streamed", args.requests, Path(tmp)) for mode in ("streamed", "non-streamed")}
    labels = [label for label, _ in COMPONENTS] + [OTHER]
    rows = []
    for label in labels:
        cells = []
        for by_component in results.values():
            total = sum(by_component.values())
            seconds = by_component.get(label, 0.0)
            cells.append(f"{seconds / args.requests * 1e6:,.0f} µs ({seconds / total:.0%})")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append("| all (profiled) | " + " | ".join(
        f"{sum(by_component.values()) / args.requests * 1e6:,.0f} µs" for by_component in results.values()) + " |")
    command = "`.venv/bin/python benchmarks/proxy_profile.py --requests " + str(args.requests) + " --write`"
    text = "\n".join([
        f"Command: {command} (revision {revision()}, {machine()}); `inferwatch serve` at its defaults under "
        "cProfile in front of the shared bench's instant fake upstream, 64-chunk chat streams and non-streamed "
        "answers at concurrency 16, the profile's own time summed by component. cProfile slows Python code "
        "several times and C code hardly, so read the shares; the µs are profiled time per request.",
        "",
        "| component | streamed, per request | non-streamed, per request |",
        "|---|---:|---:|",
        *rows,
        "",
        "The start-up and shutdown of the process are in the profile too (a few % at this many requests).",
    ])
    print(text)
    print(json.dumps(results), file=sys.stderr)
    if args.write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
