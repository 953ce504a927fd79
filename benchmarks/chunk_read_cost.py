"""What reading one chunk of a paced stream costs in a running server, against a reader that only counts.

The paced cells of "Proxy cost against peers" leave the sidecar's per-chunk work a budget of a few
µs. This measures where that work stands: the shared bench's fake upstream paces a 64-chunk
chat stream at 5 ms per chunk (one event per socket read, as a GPU's decode paces it), and each
server below times every call of its stream reader (``perf_counter_ns`` around the call, in the
relay's socket callback) while it serves streams at concurrency 16:

- the bare forwarder (benchmarks/bare_forwarder.py) with a reader that looks at nothing: the
  timer's own cost;
- the bare forwarder with a reader that only counts each chunk and notes its time, the least any
  per-token measurement does;
- the bare forwarder with inferwatch's SSE reader (serving/sse.py), as the proxy makes it;
- ``inferwatch serve`` at its defaults (its own SSE reader, with the rest of its work around it).

The same readers are also timed in a loop over the upstream's own events, one event a call, warm
(caches hot, as a read that brings several events sees them). Rounds alternate the servers.

    .venv/bin/python benchmarks/chunk_read_cost.py [--rounds 3] [--streams 400] [--write]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, percentile, revision, write_section
from benchmarks.proxy_profile import BENCH, drive, wait_ready
from serving.config import ServeConfig
from serving.sse import SseReader
from serving.stream_relay import PieceReader
from serving.tools.launcher import free_port

SECTION = "Reading a paced chunk"
CHUNK_DELAY_MS = 5.0
WARM_UP = 64
"""Streams sent to each server before its timed ones (connections opened, first-use paths taken)."""
WARM_LOOPS = 200
"""Streams fed to each reader in the warm loop."""


class CountingReader:
    """Counts each piece and notes when it came, forwards it as it came: the least a measuring proxy does."""

    broken = False

    def __init__(self) -> None:
        self.pieces = 0
        self.last_ns = 0

    def feed(self, data: bytes, now_ns: int) -> bytes:
        self.pieces += 1
        self.last_ns = now_ns
        return data


def proxy_sse_reader() -> SseReader:
    """inferwatch's reader as the proxy makes it for a streamed request at the default settings."""
    return SseReader(strip_usage_chunk=True, strip_usage_field=False,
                     max_event_bytes=ServeConfig().max_event_bytes, trace_id="0" * 32)


def _pass_through() -> PieceReader:
    from benchmarks.bare_forwarder import PassThrough

    return PassThrough()


READERS: dict[str, Callable[[], PieceReader]] = {
    "pass": _pass_through, "count": CountingReader, "sse": proxy_sse_reader,
}
SERVERS = {  # name -> (row label, reader in the bare forwarder; None: inferwatch serve with its own)
    "pass": ("bare forwarder, a reader that looks at nothing (the timer's own cost)", "pass"),
    "count": ("bare forwarder, a reader that only counts each chunk and notes its time", "count"),
    "sse": ("bare forwarder, inferwatch's SSE reader", "sse"),
    "inferwatch": ("`inferwatch serve` at its defaults (its SSE reader)", None),
}


def timed(feed: Callable[[bytes, int], bytes], starts: array.array, took: array.array) -> Callable[[bytes, int], bytes]:
    """``feed`` with each call's start and duration (perf_counter_ns, the host's monotonic clock) noted."""
    clock = time.perf_counter_ns

    def feed_timed(data: bytes, now_ns: int) -> bytes:
        began = clock()
        out = feed(data, now_ns)
        took.append(clock() - began)
        starts.append(began)
        return out

    return feed_timed


def run_server(name: str, upstream: str, port: int, out: Path, logs_dir: Path) -> None:
    """Serve with the reader of ``name`` timed; on SIGINT, write the calls' starts and durations to ``out``."""
    import uvloop

    from benchmarks import bare_forwarder
    from serving import stream_relay

    starts, took = array.array("q"), array.array("q")
    original = stream_relay.StreamRelay.__init__

    def relay_init(self: stream_relay.StreamRelay, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        self._feed = timed(self._feed, starts, took)

    stream_relay.StreamRelay.__init__ = relay_init  # type: ignore[method-assign]
    try:
        reader = SERVERS[name][1]
        if reader is None:
            from serving.cli import main as cli_main

            cli_main(["serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--logs-dir", str(logs_dir),
                      "--gpu-enabled", "false"])
        else:
            uvloop.run(bare_forwarder.serve(upstream, "127.0.0.1", port, READERS[reader]))
    except KeyboardInterrupt:
        pass
    finally:
        out.write_bytes(len(starts).to_bytes(8, "little") + starts.tobytes() + took.tobytes())


def read_calls(path: Path, since_ns: int, until_ns: int) -> list[int]:
    """The durations (ns) of the calls a server noted that started within ``[since_ns, until_ns]``."""
    raw = path.read_bytes()
    count = int.from_bytes(raw[:8], "little")
    starts, took = array.array("q"), array.array("q")
    starts.frombytes(raw[8:8 + 8 * count])
    took.frombytes(raw[8 + 8 * count:])
    return [t for s, t in zip(starts, took, strict=True) if since_ns <= s <= until_ns]


def one_round(name: str, upstream: str, streams: int, workdir: Path) -> list[int]:
    """Start the server of ``name``, warm it up, time ``streams`` streams through it; the reader's call durations."""
    port, out = free_port(), workdir / f"{name}.calls"
    server = subprocess.Popen([sys.executable, __file__, "--serve", name, "--upstream", upstream, "--port", str(port),
                               "--out", str(out), "--logs-dir", str(workdir / f"logs-{name}")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz")
        url = f"http://127.0.0.1:{port}"
        asyncio.run(drive(url, True, WARM_UP))
        since = time.perf_counter_ns()
        asyncio.run(drive(url, True, streams))
        until = time.perf_counter_ns()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    return read_calls(out, since, until)


def upstream_events(upstream: str) -> list[bytes]:
    """One stream of the upstream, as its events (each with its blank line): the warm loop's input."""
    body = b'{"model": "ppb-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": true}'
    request = urllib.request.Request(upstream + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return [event + b"\n\n" for event in text.split(b"\n\n") if event]


def warm_ns(reader: Callable[[], PieceReader], events: list[bytes]) -> list[int]:
    """Durations (ns) of the reader's calls fed ``events`` one a call, ``WARM_LOOPS`` streams in a row."""
    starts, took = array.array("q"), array.array("q")
    for _ in range(WARM_LOOPS):
        feed = timed(reader().feed, starts, took)
        for event in events:
            feed(event, time.perf_counter_ns())
    return list(took)


def mean_us(values: list[int]) -> float:
    return sum(values) / len(values) / 1e3 if values else float("nan")


def report(calls: dict[str, list[int]], warm: dict[str, list[int]], args: argparse.Namespace) -> str:
    rows = []
    for name, (label, reader) in SERVERS.items():
        hot = warm[reader or "sse"]
        rows.append(f"| {label} | {len(calls[name]):,} | {mean_us(calls[name]):.2f} | "
                    f"{percentile(calls[name], 0.5) / 1e3:.2f} | {mean_us(hot):.2f} | "
                    f"{mean_us(calls[name]) / mean_us(hot):.1f}× |")
    floor = mean_us(calls["pass"])
    count, bare_sse, ours = (mean_us(calls[n]) - floor for n in ("count", "sse", "inferwatch"))
    warm_sse = mean_us(warm["sse"]) - mean_us(warm["pass"])
    command = (f"`.venv/bin/python benchmarks/chunk_read_cost.py --rounds {args.rounds} --streams {args.streams}"
               " --write`")
    return "\n".join([
        f"Command: {command} (revision {revision()}, {machine()}); the shared bench's fake upstream paced at "
        f"{CHUNK_DELAY_MS:g} ms per chunk, 64-chunk chat streams at concurrency 16, {args.streams:,} streams a "
        f"round after {WARM_UP} of warm-up, {args.rounds} rounds alternating the servers. Each server times "
        "every call of its stream reader in the relay's socket callback (one call per socket read: here, per "
        "event); the warm column feeds the same reader the upstream's own events in a loop, one a call, "
        f"{WARM_LOOPS} streams in a row. The timer's own cost is in every figure (the first row).",
        "",
        "| server and reader | calls timed | running server: mean µs per call | p50 | warm loop: mean µs per call "
        "| running / warm |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Less the timer's own cost: counting a chunk and noting its time, nothing else, costs {count:.2f} µs a "
        f"chunk in the running forwarder; inferwatch's SSE reader costs {bare_sse:.2f} µs there and {ours:.2f} µs "
        f"in the running sidecar, against {warm_sse:.2f} µs in the warm loop. A paced stream wakes the process "
        "once per chunk, so each chunk's work finds the reader, its counters and the code cold in the caches; "
        "what a loop measures is not what a paced chunk costs.",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each server once a round (default 3)")
    parser.add_argument("--streams", type=int, default=400, help="timed streams per server and round (default 400)")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)  # a server of one round
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--logs-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run_server(args.serve, args.upstream, args.port, args.out, args.logs_dir)
        return 0
    if not BENCH.exists():
        print(f"chunk_read_cost: missing {BENCH} (the shared proxy bench)", file=sys.stderr)
        return 2
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port),
                                 "--chunk-delay-ms", str(CHUNK_DELAY_MS)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    calls: dict[str, list[int]] = {name: [] for name in SERVERS}
    try:
        url = f"http://127.0.0.1:{upstream_port}"
        wait_ready(url + "/v1/models")
        events = upstream_events(url)
        warm = {reader: warm_ns(factory, events) for reader, factory in READERS.items()}
        with tempfile.TemporaryDirectory(prefix="chunk-read-cost-") as tmp:
            for round_ in range(1, args.rounds + 1):
                for name in SERVERS:
                    calls[name] += one_round(name, url, args.streams, Path(tmp))
                    print(f"round {round_}/{args.rounds} {name}: {mean_us(calls[name]):.2f} µs a call so far",
                          file=sys.stderr, flush=True)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    text = report(calls, warm, args)
    print(text)
    if args.write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
