"""The sidecar's own refusals outside /v1 (admin, unknown paths, wrong methods) in the proxy's JSON error shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from serving.admin import admin_guard
from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer
from tests.unit.serving.inprocess import start_sidecar

TOKEN = b"admin-token-0123456789"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(name="upstream", scope="module")
def _upstream() -> Iterator[ThreadedServer]:
    with ThreadedServer(FaultyUpstream(record=False).app) as server:
        yield server


def _error_of(body: bytes, headers: Any, status: int, kind: str) -> dict[str, Any]:
    """The error object of an answer, checked against the shape every /v1 error has."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "code", "trace_id"}
    assert (error["type"], error["code"]) == (kind, status)
    assert re.fullmatch(r"[0-9a-f]{32}", error["trace_id"])
    assert headers["x-trace-id"] == error["trace_id"]
    assert headers["Content-Type"].startswith("application/json")
    return error


async def _reached(_request: web.Request) -> web.Response:
    return web.Response(text="reached")


async def test_a_missing_or_wrong_admin_token_is_401_unauthorized_with_a_trace_id() -> None:
    """A remote client without the bearer token, or with a wrong one, gets 401 'unauthorized', WWW-Authenticate,
    and the JSON error with trace_id; the token itself is never echoed."""
    guard = admin_guard(TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": "Basic eA=="}):
        request = make_mocked_request("GET", "/admin/alerts", headers=headers).clone(remote="192.0.2.7")
        answer = await guard(request, _reached)
        assert answer.status == 401
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        error = _error_of(answer.body, answer.headers, 401, "unauthorized")
        assert "wrong-token" not in error["message"]


async def test_an_admin_call_no_credential_could_allow_is_403_forbidden() -> None:
    """Without a token file a remote client cannot be let in: 403 'forbidden', JSON with trace_id; a traceparent's
    trace id is the answer's."""
    request = make_mocked_request("GET", "/admin/runtime", headers={"traceparent": TRACEPARENT}).clone(
        remote="192.0.2.7")
    answer = await admin_guard(None)(request, _reached)
    assert answer.status == 403
    error = _error_of(answer.body, answer.headers, 403, "forbidden")
    assert error["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_unknown_paths_and_wrong_methods_answer_json_with_a_trace_id(
    upstream: ThreadedServer, tmp_path: Path
) -> None:
    """Over HTTP through the front: an unknown path (top level or under /admin/) is a JSON 404, a wrong method a
    JSON 405 with Allow; each names a fresh trace id, or the caller's from traceparent."""
    sidecar, runner = await start_sidecar(upstream.url, tmp_path / "logs")
    try:
        seen = set()
        for method, path, status, kind in (("GET", "/nope", 404, "not_found"),
                                           ("GET", "/admin/nope", 404, "not_found"),
                                           ("POST", "/metrics", 405, "method_not_allowed")):
            async with sidecar.session.request(method, sidecar.url + path) as response:
                error = _error_of(await response.read(), response.headers, status, kind)
                assert path in error["message"]
                seen.add(error["trace_id"])
                if status == 405:
                    assert "GET" in response.headers["Allow"]
        assert len(seen) == 3  # a new trace id per answer
        async with sidecar.session.get(sidecar.url + "/nope", headers={"traceparent": TRACEPARENT}) as response:
            error = _error_of(await response.read(), response.headers, 404, "not_found")
        assert error["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    finally:
        await sidecar.session.close()
        await runner.cleanup()
