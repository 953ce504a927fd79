"""What reading one chunk of a paced stream costs in a running server, against a reader that only counts.

The paced cells of "Proxy cost against peers" leave the sidecar's per-chunk work a budget of a few
µs. This measures where that work stands: the shared bench's fake upstream paces a 64-chunk
chat stream at 5 ms per chunk (one event per socket read, as a GPU's decode paces it), and each
server below times every piece's calls of its stream reader (``perf_counter_ns`` around each call, in
the relay's socket callback: ``take_event``, and ``feed`` for a piece it declines) while it serves
streams at concurrency 16:

- the bare forwarder (benchmarks/bare_forwarder.py) with a reader that looks at nothing: the
  timer's own cost;
- the bare forwarder with a reader that only counts each chunk and notes its time, the least any
  per-token measurement does;
- the bare forwarder with inferwatch's SSE reader (serving/sse.py), as the proxy makes it;
- ``inferwatch serve`` at its defaults (its own SSE reader, with the rest of its work around it).

The same readers are also timed in a loop over the upstream's own events, one event a call, warm
(caches hot, as a read that brings several events sees them). Rounds alternate the servers. A
stream's mid-stream calls (what each further chunk costs) are reported apart from its first and
last two (the events the SSE reader parses: a cost per stream).

    .venv/bin/python benchmarks/chunk_read_cost.py [--rounds 3] [--streams 400] [--write]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, percentile, publish, revision
from benchmarks.bare_forwarder import PassThrough
from benchmarks.bare_forwarder import serve as serve_bare
from benchmarks.proxy_profile import BENCH, drive, wait_ready
from serving.cli import main as cli_main
from serving.config import ServeConfig
from serving.sse import SseReader
from serving.stream_relay import PieceReader, StreamRelay
from serving.tools.launcher import free_port

SECTION = "Reading a paced chunk"
CHUNK_DELAY_MS = 5.0
WARM_UP = 64
"""Streams sent to each server before its timed ones (connections opened, first-use paths taken)."""
WARM_LOOPS = 200
"""Streams fed to each reader in the warm loop."""
ENDS = 2
"""Calls at each end of a stream kept apart from the mid-stream ones."""


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

    def take_event(self, _data: bytes, _start: int, _end: int, now_ns: int) -> bool:
        self.pieces += 1
        self.last_ns = now_ns
        return True


def proxy_sse_reader() -> SseReader:
    """inferwatch's reader as the proxy makes it for a streamed request at the default settings."""
    return SseReader(strip_usage_chunk=True, strip_usage_field=False,
                     max_event_bytes=ServeConfig().max_event_bytes, trace_id="0" * 32)


READERS: dict[str, Callable[[], PieceReader]] = {
    "pass": PassThrough, "count": CountingReader, "sse": proxy_sse_reader,
}
SERVERS = {  # name -> (row label, reader in the bare forwarder; None: inferwatch serve with its own)
    "pass": ("bare forwarder, a reader that looks at nothing (the timer's own cost)", "pass"),
    "count": ("bare forwarder, a reader that only counts each chunk and notes its time", "count"),
    "sse": ("bare forwarder, inferwatch's SSE reader", "sse"),
    "inferwatch": ("`inferwatch serve` at its defaults (its SSE reader)", None),
}


TakeEvent = Callable[[bytes, int, int, int], bool]
Feed = Callable[[bytes, int], bytes]


class StreamCalls:
    """The durations (ns) of one stream's reader calls, one a piece, in order, and when its relay was made (``began``).

    A piece's duration is its ``take_event`` call's, plus its ``feed`` call's when ``take_event`` declined it
    (the relay then hands it to ``feed``); a piece that went to ``feed`` alone (not one whole HTTP chunk), that call's.
    """

    __slots__ = ("began", "declined", "took")

    def __init__(self) -> None:
        self.began = 0
        self.took = array.array("q")
        self.declined = False  # the last piece's take_event declined it: its feed call adds to its duration

    def timed(self, reader: PieceReader) -> tuple[TakeEvent, Feed]:
        """``reader``'s ``take_event`` and ``feed`` with each piece's time in them noted (perf_counter_ns, the
        host's monotonic clock)."""
        clock, took, take, feed = time.perf_counter_ns, self.took, reader.take_event, reader.feed

        def take_timed(data: bytes, start: int, end: int, now_ns: int) -> bool:
            began = clock()
            taken = take(data, start, end, now_ns)
            took.append(clock() - began)
            self.declined = not taken
            return taken

        def feed_timed(data: bytes, now_ns: int) -> bytes:
            began = clock()
            out = feed(data, now_ns)
            spent = clock() - began
            if self.declined:
                took[-1] += spent
                self.declined = False
            else:
                took.append(spent)
            return out

        self.began = clock()
        return take_timed, feed_timed


def run_server(name: str, upstream: str, port: int, out: Path, logs_dir: Path) -> None:
    """Serve with the reader of ``name`` timed; on SIGINT, write each stream's calls to ``out`` (JSON)."""
    # Started from a background job, a process inherits SIGINT ignored: take it back, it is the stop signal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    streams: list[StreamCalls] = []
    original = StreamRelay.__init__

    def relay_init(self: StreamRelay, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        streams.append(calls := StreamCalls())
        self._take_event, self._feed = calls.timed(self._reader)

    StreamRelay.__init__ = relay_init  # type: ignore[method-assign]
    try:
        reader = SERVERS[name][1]
        if reader is None:
            cli_main(["serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--logs-dir", str(logs_dir),
                      "--gpu-enabled", "false"])
        else:
            uvloop.run(serve_bare(upstream, "127.0.0.1", port, READERS[reader]))
    except KeyboardInterrupt:
        pass
    finally:
        out.write_text(json.dumps([[calls.began, calls.took.tolist()] for calls in streams]))


def split_calls(streams: Iterable[list[int]]) -> tuple[list[int], list[int]]:
    """Each stream's calls split in two: mid-stream ones, and its first ``ENDS`` and last ``ENDS`` (the role and
    first content events, which the SSE reader parses; the finishing event and ``[DONE]``)."""
    middle: list[int] = []
    ends: list[int] = []
    for took in streams:
        middle += took[ENDS:-ENDS]
        ends += took[:ENDS] + took[-ENDS:]
    return middle, ends


def one_round(name: str, upstream: str, streams: int, workdir: Path) -> list[list[int]]:
    """Start the server of ``name``, warm it up, time ``streams`` streams through it; each one's call durations."""
    port, out = free_port(), workdir / f"{name}.json"
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
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise SystemExit(f"chunk_read_cost: the {name} server did not stop on SIGINT within 60 s") from None
    return [took for began, took in json.loads(out.read_text()) if since <= began <= until and len(took) > 2 * ENDS]


def upstream_events(upstream: str) -> list[bytes]:
    """One stream of the upstream, as its events (each with its blank line): the warm loop's input."""
    body = b'{"model": "ppb-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": true}'
    request = urllib.request.Request(upstream + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return [event + b"\n\n" for event in text.split(b"\n\n") if event]


def warm_streams(reader: Callable[[], PieceReader], events: list[bytes]) -> list[list[int]]:
    """Call durations (ns) of the reader fed ``events`` one a call, ``WARM_LOOPS`` streams in a row."""
    out = []
    for _ in range(WARM_LOOPS):
        calls = StreamCalls()
        take, feed = calls.timed(reader())
        for event in events:  # as the relay takes a read of one whole HTTP chunk
            now_ns = time.perf_counter_ns()
            if not take(event, 0, len(event), now_ns):
                feed(event, now_ns)
        out.append(calls.took.tolist())
    return out


def mean_us(values: list[int]) -> float:
    return sum(values) / len(values) / 1e3 if values else float("nan")


def report(runs: dict[str, list[list[int]]], warm: dict[str, list[list[int]]], args: argparse.Namespace) -> str:
    """The section: per server, the mid-stream calls against the same reader's in the warm loop, and the ends."""
    split = {name: split_calls(streams) for name, streams in runs.items()}
    hot = {reader: split_calls(streams) for reader, streams in warm.items()}
    rows = []
    for name, (label, reader) in SERVERS.items():
        (middle, ends), warm_middle = split[name], hot[reader or "sse"][0]
        rows.append(f"| {label} | {len(runs[name]):,} | {mean_us(middle):.2f} | {percentile(middle, 0.5) / 1e3:.2f} | "
                    f"{mean_us(warm_middle):.2f} | {mean_us(middle) / mean_us(warm_middle):.1f}× | "
                    f"{mean_us(ends):.1f} |")
    floor = mean_us(split["pass"][0])
    count, bare_sse, ours = (mean_us(split[name][0]) - floor for name in ("count", "sse", "inferwatch"))
    warm_sse = mean_us(hot["sse"][0]) - mean_us(hot["pass"][0])
    ends_us = mean_us(split["inferwatch"][1]) - mean_us(split["pass"][1])
    command = (f"`.venv/bin/python benchmarks/chunk_read_cost.py --rounds {args.rounds} --streams {args.streams}"
               " --write`")
    return "\n".join([
        f"Command: {command} (revision {revision()}, {machine()}); the shared bench's fake upstream paced at "
        f"{CHUNK_DELAY_MS:g} ms per chunk, 64-chunk chat streams at concurrency 16, {args.streams:,} streams a "
        f"round after {WARM_UP} of warm-up, {args.rounds} rounds alternating the servers. Each server times "
        "its stream reader's calls in the relay's socket callback, per socket read (here, per event): "
        "`take_event`, and `feed` for a read it declines. Mid-stream calls are all but a stream's first and last "
        f"{ENDS} (its role and first content events, which the SSE reader parses, and its finishing event and "
        "`[DONE]`): what each further chunk costs. The warm loop feeds the same reader the upstream's own "
        f"events, one a call, {WARM_LOOPS} streams in a row. The timer's own cost is in every figure (the first row).",
        "",
        "| server and reader | streams timed | mid-stream call, running server: mean µs | p50 | warm loop: mean µs "
        f"| running / warm | first and last {ENDS} calls, running server: mean µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Less the timer's own cost, a mid-stream chunk costs: {count:.2f} µs to count it and note its time, "
        f"nothing else, in the running forwarder; {bare_sse:.2f} µs through inferwatch's SSE reader there and "
        f"{ours:.2f} µs in the running sidecar, against {warm_sse:.2f} µs in the warm loop"
        + (f": in the running sidecar {ours / warm_sse:.1f}× the loop's, so a loop's figure understates what a "
           "paced chunk costs. " if ours > warm_sse else ". ")
        + f"The sidecar's reader also spends {ends_us:.1f} µs on each of a stream's first and last {ENDS} calls, "
        f"{2 * ENDS * ends_us:,.0f} µs a stream.",
    ])


def measure(servers: tuple[str, ...], rounds: int, streams: int) -> tuple[dict[str, list[list[int]]],
                                                                           dict[str, list[list[int]]]]:
    """Each server's timed streams (``rounds`` rounds of ``streams``, alternating) and each reader's warm loop."""
    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port),
                                 "--chunk-delay-ms", str(CHUNK_DELAY_MS)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: dict[str, list[list[int]]] = {name: [] for name in servers}
    try:
        url = f"http://127.0.0.1:{upstream_port}"
        wait_ready(url + "/v1/models")
        events = upstream_events(url)
        warm = {reader: warm_streams(factory, events) for reader, factory in READERS.items()}
        with tempfile.TemporaryDirectory(prefix="chunk-read-cost-") as tmp:
            for round_ in range(1, rounds + 1):
                for name in servers:
                    runs[name] += one_round(name, url, streams, Path(tmp))
                    middle = split_calls(runs[name])[0]
                    print(f"chunk_read_cost round {round_}/{rounds} {name}: {mean_us(middle):.2f} µs a mid-stream "
                          "call so far", file=sys.stderr, flush=True)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    return runs, warm


def sidecar_reader_us(rounds: int, streams: int) -> float:
    """The sidecar's SSE reader on a mid-stream paced chunk, in the running sidecar, less the timer's own cost."""
    runs, _ = measure(("pass", "inferwatch"), rounds, streams)
    return mean_us(split_calls(runs["inferwatch"])[0]) - mean_us(split_calls(runs["pass"])[0])


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
    runs, warm = measure(tuple(SERVERS), args.rounds, args.streams)
    text = report(runs, warm, args)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
