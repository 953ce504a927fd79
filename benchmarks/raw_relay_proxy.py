"""What a Python proxy costs without aiohttp's server: asyncio protocols and httptools, bytes relayed as they come.

A reference peer for the shared proxy bench (benchmarks/peer_overhead.py starts it), not a
proxy to deploy: one connection at a time per upstream connection, no timeouts, no limits, no
flow control, nothing measured. Each request is parsed (httptools), sent upstream on a kept-alive
connection, and the answer's bytes go back to the client unchanged, its end found by the
parser. The gap between it and benchmarks/bare_forwarder.py is what aiohttp's server costs.

    python benchmarks/raw_relay_proxy.py --upstream URL --listen HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
from urllib.parse import urlsplit

import httptools
import uvloop

HOP_BY_HOP = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"})


class UpstreamSide(asyncio.Protocol):
    """One kept-alive upstream connection relaying an answer's bytes to the client that asked."""

    def __init__(self, idle: list[UpstreamSide]) -> None:
        self.idle = idle
        self.client: ClientSide | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client = None
        self.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()


class ClientSide(asyncio.Protocol):
    """One client connection: each request parsed and sent upstream whole."""

    def __init__(self, host: str, port: int, idle: list[UpstreamSide]) -> None:
        self.host, self.port, self.idle = host, port, idle
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url, self.headers, self.body = b"", [], []  # type: ignore[var-annotated]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in HOP_BY_HOP:
            self.headers.append(name + b": " + value + b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        head = b"%s %s HTTP/1.1\r\nHost: %s:%d\r\n%sContent-Length: %d\r\n\r\n" % (
            self.parser.get_method(), self.url, self.host.encode(), self.port, b"".join(self.headers), len(body))
        asyncio.get_running_loop().create_task(self.send(head + body))

    async def send(self, request: bytes) -> None:
        if self.idle:
            upstream = self.idle.pop()
        else:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: UpstreamSide(self.idle), self.host, self.port)
        upstream.client = self
        assert upstream.transport is not None
        upstream.transport.write(request)


async def serve(upstream: str, listen: str) -> None:
    parts = urlsplit(upstream)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    idle: list[UpstreamSide] = []
    listen_host, _, listen_port = listen.rpartition(":")
    server = await asyncio.get_running_loop().create_server(
        lambda: ClientSide(host, port, idle), listen_host, int(listen_port), backlog=1024)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    args = parser.parse_args()
    uvloop.run(serve(args.upstream, args.listen))


if __name__ == "__main__":
    main()
