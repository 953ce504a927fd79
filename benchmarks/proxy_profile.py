"""Where the sidecar's CPU goes, by component: ``inferwatch serve`` sampled by py-spy under a load.

Starts the shared bench's fake upstream (``../shared/tools/peer_proxy_bench.py upstream``, 64
chunks per stream, instant or paced at 5 ms per chunk like a fast GPU's decode), runs
``inferwatch serve`` at its defaults in front of it, sends a warm-up, then samples the sidecar
with ``py-spy record --native`` (Python, Cython and C frames, system calls included) while it
serves the measured requests at concurrency 16. Each sample of the event-loop thread that is
not waiting in ``epoll`` goes to the component of its innermost frame that has one; a sample
inside a socket read or write goes to the system calls. The shares are then applied to the
event-loop thread's CPU time over the same requests (from /proc), which gives µs per request.
A sampler has no per-call overhead, unlike cProfile, so cheap, frequent calls are not
inflated; py-spy pauses the process for each sample (about 1 % at this rate).

    pip install py-spy   # not a dependency of inferwatch; root or ptrace rights over the sidecar
    .venv/bin/python benchmarks/proxy_profile.py [--requests 3000] [--write]

``--requests`` is the paced streams' count; twice as many unpaced streams and five times as many
non-streamed requests are sent (see ``MODES``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, publish, revision
from serving.tools.launcher import free_port

BENCH = ROOT.parent / "shared" / "tools" / "peer_proxy_bench.py"
SECTION = "Proxy CPU by component"
SAMPLES_PER_S = 200
WARM_UP = 64
"""Requests sent before sampling starts (connections opened, first-use paths taken)."""
MODES = {"streamed": (True, 0.0, 2), "streamed, paced 5 ms/chunk": (True, 5.0, 1), "non-streamed": (False, 0.0, 5)}
"""Each column: (streamed, the upstream's delay between chunks in ms, requests as a multiple of --requests: the
cheaper a request, the more of them, for a few hundred samples at least)."""
SYSCALLS = "socket reads and writes (system calls: the kernel's TCP work)"
COMPONENTS = (  # first match from the innermost frame out wins: (component, substrings of the frame)
    ("SSE reader (serving/sse.py)", ("serving/sse.py",)),
    ("stream relay (serving/stream_relay.py)", ("serving/stream_relay.py",)),
    ("front: the HTTP server of /v1 (serving/front.py, exchange)", ("serving/front.py", "serving/exchange.py")),
    ("upstream client (serving/upstream_http.py, httptools)", ("serving/upstream_http.py", "httptools")),
    ("tracing (serving/tracing.py, OpenTelemetry)", ("serving/tracing.py", "opentelemetry")),
    ("metrics (request_metrics, batch_histogram, prometheus_client)",
     ("exporters/request_metrics.py", "exporters/batch_histogram.py", "prometheus_client")),
    ("request log (log_pipeline: event, sampling, sink)", ("log_pipeline",)),
    ("proxy request path (serving/proxy.py, admission, body checks)",
     ("serving/proxy.py", "serving/admission.py", "serving/body_checks.py", "serving/errors.py")),
    ("other sidecar code (app observers, exporters, structlog)", ("serving/", "exporters/", "structlog")),
    ("aiohttp (the server behind /healthz and /metrics, the client of the scrapes)", ("aiohttp/",)),
)
OTHER = "event loop (uvloop), asyncio and the rest"
LOOP_FRAMES = frozenset({"uv_run", "run_forever"})
"""Frames of the event loop itself: a sample below one is the event-loop thread's."""
SOCKET_CALLS = frozenset({"read", "write", "writev", "readv", "recv", "send", "recvfrom", "sendto", "recvmsg",
                          "sendmsg", "__libc_read", "__libc_write"})


def frame_name(frame: str) -> str:
    """``'write (libc.so.6)'`` -> ``'write'``: the function of a py-spy frame."""
    return frame.split(" (", 1)[0]


def component(frames: list[str]) -> str:
    """The component one busy sample of the event-loop thread belongs to (frames outermost first)."""
    if frame_name(frames[-1]) in SOCKET_CALLS:
        return SYSCALLS
    loop = max(i for i, frame in enumerate(frames) if frame_name(frame) in LOOP_FRAMES)
    for frame in reversed(frames[loop + 1:]):  # what the loop called, not what started the loop
        for label, needles in COMPONENTS:
            if any(needle in frame for needle in needles):
                return label
    return OTHER


def shares(raw: Path) -> Counter[str]:
    """Busy samples of the event-loop thread by component, from py-spy's raw (collapsed stacks) output."""
    samples: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(frame_name(f) in LOOP_FRAMES for f in frames):
            continue  # another thread (the log writer, the OTLP exporters): off the request path
        if "epoll" in frames[-1]:
            continue  # waiting for work
        samples[component(frames)] += int(count)
    return samples


def wait_ready(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"proxy_profile: {url} not ready within {deadline_s:.0f} s")


CHAT_BODY = {"model": "ppb-model", "messages": [{"role": "user", "content": "Say hello to the benchmark."}],
             "max_tokens": 64}
"""The chat request the benchmarks send the shared bench's fake upstream (``stream`` added per request)."""


async def drive(url: str, stream: bool, requests: int, concurrency: int = 16) -> None:
    body = {**CHAT_BODY, "stream": stream}
    left = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in left:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"proxy_profile: the sidecar answered {response.status}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process's main thread, the event loop's."""
    thread = next(t for t in psutil.Process(pid).threads() if t.id == pid)
    return thread.user_time + thread.system_time


def profile(mode: str, requests: int, workdir: Path, py_spy: str) -> tuple[Counter[str], float]:
    """Busy samples by component and the event-loop thread's CPU seconds over ``requests`` requests."""
    stream, delay_ms, _ = MODES[mode]
    upstream_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port),
                                 "--chunk-delay-ms", str(delay_ms)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "serve", "--upstream", f"http://127.0.0.1:{upstream_port}",
         "--listen", f"127.0.0.1:{port}", "--logs-dir", str(workdir / "logs"), "--gpu-enabled", "false"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raw = workdir / f"{len(list(workdir.glob('*.txt')))}.txt"
    try:
        wait_ready(f"http://127.0.0.1:{upstream_port}/v1/models")
        wait_ready(f"http://127.0.0.1:{port}/healthz")
        url = f"http://127.0.0.1:{port}"
        asyncio.run(drive(url, stream, WARM_UP))
        sampler = subprocess.Popen([py_spy, "record", "--pid", str(sidecar.pid), "--native", "--rate",
                                    str(SAMPLES_PER_S), "--format", "raw", "--output", str(raw)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attached
        if sampler.poll() is not None:
            raise SystemExit(f"proxy_profile: py-spy failed: {sampler.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
        cpu_before = main_thread_cpu_s(sidecar.pid)
        asyncio.run(drive(url, stream, requests))
        cpu_s = main_thread_cpu_s(sidecar.pid) - cpu_before
        sampler.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        sampler.wait(timeout=60)
    finally:
        sidecar.send_signal(signal.SIGINT)
        sidecar.wait(timeout=60)
        upstream.terminate()
        upstream.wait(timeout=10)
    return shares(raw), cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000,
                        help="paced streams (default 3000); twice as many unpaced streams and five times as many "
                        "non-streamed requests")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    missing = [what for what, there in ((str(BENCH), BENCH.exists()), ("py-spy", py_spy)) if not there]
    if missing:
        print(f"proxy_profile: missing {', '.join(missing)}; see this script's docstring", file=sys.stderr)
        return 2
    assert py_spy is not None
    with tempfile.TemporaryDirectory(prefix="proxy-profile-") as tmp:
        results = {mode: profile(mode, args.requests * scale, Path(tmp), py_spy)
                   for mode, (_, _, scale) in MODES.items()}
    rows = []
    for label in [SYSCALLS, *(label for label, _ in COMPONENTS), OTHER]:
        cells = []
        for mode, (samples, cpu_s) in results.items():
            share = samples[label] / max(sum(samples.values()), 1)
            cells.append(f"{share * cpu_s / (args.requests * MODES[mode][2]) * 1e6:,.0f} µs ({share:.0%})")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append("| all: the event-loop thread's CPU | " + " | ".join(
        f"{cpu_s / (args.requests * MODES[mode][2]) * 1e6:,.0f} µs ({sum(samples.values()):,} samples)"
        for mode, (samples, cpu_s) in results.items()) + " |")
    counts = ", ".join(f"{args.requests * scale:,} {mode}" for mode, (_, _, scale) in MODES.items())
    command = "`.venv/bin/python benchmarks/proxy_profile.py --requests " + str(args.requests) + " --write`"
    text = "\n".join([
        f"Command: {command} (revision {revision()}, {machine()}); `inferwatch serve` at its defaults in front "
        "of the shared bench's fake upstream, instant or paced at 5 ms per chunk, 64-chunk chat streams and "
        f"non-streamed answers at concurrency 16 ({counts}), sampled by py-spy ({SAMPLES_PER_S} a second, "
        f"native frames) after {WARM_UP} requests of warm-up. Each busy sample of the event-loop thread goes to "
        "the component of its innermost frame that has one (a socket read or write to the system calls); the "
        "shares are applied to that thread's CPU time over the same requests. Other threads (the log archive's writer) "
        "are off the request path and not counted.",
        "",
        "| component | " + " | ".join(f"{mode}, per request" for mode in MODES) + " |",
        "|---|" + "---:|" * len(MODES),
        *rows,
    ])
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
