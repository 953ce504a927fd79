"""The floor of the sidecar's design: its server and upstream client forwarding bytes, measuring nothing.

Run as a peer of the shared proxy bench (benchmarks/peer_overhead.py starts it). It is
inferwatch's request path with everything inferwatch does to a request taken out: the same
front (serving/front.py) taking ``/v1/*`` with aiohttp's server behind it for the rest, the same
upstream client (serving/upstream_http.py), a stream relayed by the same hot loop
(serving/stream_relay.py) with a reader that looks at nothing. What it costs per request is the
design's floor; the gap between it and inferwatch is the sidecar's own work (admission, the SSE
reader, the span, the metrics, the record).

    python benchmarks/bare_forwarder.py --upstream URL --listen HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.exchange import Exchange, ProxyHandler
from serving.front import Front
from serving.stream_relay import PieceReader, StreamRelay
from serving.upstream_http import UpstreamPool

DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


class PassThrough:
    """A stream reader that forwards every piece as it came and looks at nothing."""

    broken = False

    @staticmethod
    def feed(data: bytes, _now_ns: int) -> bytes:
        return data

    @staticmethod
    def take_event(_data: bytes, _start: int, _end: int, _now_ns: int) -> bool:
        return True


def forwarder(pool: UpstreamPool, reader: Callable[[], PieceReader] = PassThrough) -> ProxyHandler:
    """Forward each request to the pool's upstream, streaming answers as they come through a new ``reader()``."""

    async def forward(request: Exchange) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        body = await request.read_body(1 << 26, 300.0)
        answer = await pool.request(request.method, request.path_qs, headers, body, 300.0)
        try:
            out = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED | {"content-encoding"}}
            if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
                client = await request.start_stream(answer.status, out)
                await StreamRelay(answer, reader(), 300.0, None).run(client)
                await client.finish(b"")
            else:
                request.respond(answer.status, out, await answer.read_body(300.0))
        finally:
            answer.release()

    return forward


async def serve(upstream: str, host: str, port: int, reader: Callable[[], PieceReader] = PassThrough) -> None:
    """Forward ``/v1/*`` on ``host:port`` to ``upstream`` (benchmarks/chunk_read_cost.py passes other readers)."""

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    pool = UpstreamPool(upstream, connect_timeout_s=5.0)
    front = Front(forwarder(pool, reader), header_timeout_s=75.0, max_body_bytes=1 << 26)
    await front.listen(runner, host, port)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    uvloop.run(serve(args.upstream.rstrip("/"), host, int(port)))


if __name__ == "__main__":
    main()
