"""The floor of the sidecar's design: its server and upstream client forwarding bytes, measuring nothing.

Run as a peer of the shared proxy bench (benchmarks/peer_overhead.py starts it). It is
inferwatch's request path with everything inferwatch does to a request taken out: the same
aiohttp server with the same options, the same upstream client (serving/upstream_http.py), a
stream relayed by the same hot loop (serving/stream_relay.py) with a reader that looks at
nothing. What it costs per request is the design's floor; the gap between it and inferwatch is
the sidecar's own work (admission, the SSE reader, the span, the metrics, the record).

    python benchmarks/bare_forwarder.py --upstream URL --listen HOST:PORT
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.stream_relay import StreamRelay
from serving.upstream_http import UpstreamPool

DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
POOL = web.AppKey("pool", UpstreamPool)


class PassThrough:
    """A stream reader that forwards every piece as it came and looks at nothing."""

    broken = False

    @staticmethod
    def feed(data: bytes, _now_ns: int) -> bytes:
        return data


def build(upstream: str) -> web.Application:
    """An app forwarding every request to ``upstream``, streaming answers as they come."""
    app = web.Application()

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        app[POOL] = UpstreamPool(upstream, connect_timeout_s=5.0)
        yield
        app[POOL].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        answer = await app[POOL].request(request.method, request.path_qs, headers, await request.read(), 300.0)
        try:
            out = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED | {"content-encoding"}}
            if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
                response = web.StreamResponse(status=answer.status, headers=out)
                writer = await response.prepare(request)
                await StreamRelay(answer, PassThrough(), 300.0, None).run(request, response, writer)
                await response.write_eof()
                return response
            return web.Response(body=await answer.read_body(300.0), status=answer.status, headers=out)
        finally:
            answer.release()

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    web.run_app(build(args.upstream.rstrip("/")), host=host, port=int(port), print=None, access_log=None,
                handler_cancellation=True, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
