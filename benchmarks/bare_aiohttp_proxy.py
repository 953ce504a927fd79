"""The floor of the sidecar's design: an aiohttp server and client forwarding bytes, measuring nothing.

Run as a peer of the shared proxy bench (benchmarks/peer_overhead.py starts it): what it costs
per request is what any aiohttp-based proxy pays before the first line of inferwatch's own
work (parsing, admission, tracing, metrics, records), so the gap between it and inferwatch is
ours to shrink and the rest belongs to the design.

    python benchmarks/bare_aiohttp_proxy.py --upstream URL --listen HOST:PORT
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web

DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


def build(upstream: str) -> web.Application:
    """An app forwarding every request to ``upstream``, streaming answers chunk by chunk as they come."""
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def session_ctx(_app: web.Application):  # type: ignore[no-untyped-def]
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        yield
        await sessions[0].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        async with sessions[0].request(request.method, upstream + request.path_qs, headers=headers,
                                       data=await request.read()) as answer:
            out = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED | {"content-encoding"}}
            if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
                response = web.StreamResponse(status=answer.status, headers=out)
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            return web.Response(body=await answer.read(), status=answer.status, headers=out)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.cleanup_ctx.append(session_ctx)
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
