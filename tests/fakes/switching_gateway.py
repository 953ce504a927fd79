"""A small forwarding gateway in front of real vLLM servers, for what a real server cannot be made to show.

It forwards every request (bodies read whole: the tests send non-streamed requests) to its current
``target``, and can, as a gateway on release day can:

- switch ``target`` to another server (a new model version under the same name) and answer
  ``not_ready_probes`` health probes with 503 first, as a restarting upstream does;
- rewrite the ``model`` a request names (``model_rewrites``: a stale route sends it to another model);
- list extra names in ``/v1/models`` as aliases of the target's model (``aliases``: the same ``root``).

Run it with :class:`tests.fakes.faulty_upstream.ThreadedServer` (``ThreadedServer(gateway.app)``).
"""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "host", "content-length"})


class SwitchingGateway:
    """Forwards to ``target``; see the module docstring for what it changes on the way."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.not_ready_probes = 0
        self.model_rewrites: dict[str, str] = {}
        self.aliases: list[str] = []

    def switch(self, target: str, not_ready_probes: int = 1) -> None:
        """Send everything to ``target`` from now on, answering the next health probes not ready first."""
        self.target, self.not_ready_probes = target.rstrip("/"), not_ready_probes

    def app(self) -> web.Application:
        """The gateway's aiohttp application."""
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def health(self, request: web.Request) -> web.StreamResponse:
        """503 while probes are to be refused, else the target's own answer."""
        if self.not_ready_probes > 0:
            self.not_ready_probes -= 1
            return web.json_response({"status": "switching upstream"}, status=503)
        return await self.forward(request)

    async def models(self, request: web.Request) -> web.StreamResponse:
        """The target's model list, plus ``aliases`` as entries with the first model's root."""
        async with aiohttp.ClientSession() as session, session.get(self.target + "/v1/models") as answer:
            payload = await answer.json()
        first = payload["data"][0]
        payload["data"] += [{**first, "id": alias} for alias in self.aliases]
        return web.json_response(payload)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """The request to the target (its model rewritten when a rewrite names it), the answer back as it came."""
        body = await request.read()
        if body and request.content_type == "application/json":
            payload = json.loads(body)
            if isinstance(payload, dict) and payload.get("model") in self.model_rewrites:
                payload["model"] = self.model_rewrites[payload["model"]]
                body = json.dumps(payload).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with aiohttp.ClientSession() as session, session.request(
            request.method, self.target + request.path_qs, data=body or None, headers=headers,
        ) as answer:
            data = await answer.read()
            return web.Response(body=data, status=answer.status,
                                content_type=answer.content_type or "application/octet-stream")
