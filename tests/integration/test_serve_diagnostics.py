"""A real `inferwatch serve` process's own stderr: JSON from the first line, the served request's trace id, no secret.

Every other diagnostics test configures logging itself; this one reads what `serve` wires up.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.harness import servers

pytestmark = pytest.mark.real_server

HMAC_KEY = b"hmac-key-of-the-diagnostics-test-5d1e"
ADMIN_TOKEN = b"admin-token-of-the-diagnostics-test-93b7"
API_KEY = "sk-client-api-key-of-the-diagnostics-test-c4f0"
MAX_EVENT_BYTES = 64
"""Smaller than any chunk vLLM streams: the stream fails after it started, and the proxy logs it mid-request."""


@pytest.fixture(name="guarded_sidecar", scope="module")
def _guarded_sidecar(
    vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.SidecarServer]:
    """`inferwatch serve` at its default log level, with an HMAC key and an admin token, before the real vLLM."""
    work = tmp_path_factory.mktemp("serve-diagnostics")
    (work / "hmac.key").write_bytes(HMAC_KEY + b"\n")
    (work / "admin.token").write_bytes(ADMIN_TOKEN + b"\n")
    server = servers.start_sidecar(vllm_server.base_url, work, [
        "--serve-hmac-key-file", str(work / "hmac.key"), "--serve-admin-token-file", str(work / "admin.token"),
        "--serve-max-event-bytes", str(MAX_EVENT_BYTES), "--gpu-enabled", "false",
    ])
    yield server
    server.stop()


def _signed_stream(sidecar: servers.SidecarServer, model: str) -> tuple[int, str, bytes]:
    """A signed, streamed completion carrying the client's API key; its status, trace id and body."""
    path = "/v1/completions"
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, "stream": True}).encode()
    now = int(time.time())
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}",
               TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign(HMAC_KEY, "POST", path, now, body)}
    request = urllib.request.Request(sidecar.base_url + path, body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.headers["x-trace-id"], response.read()


def _lines(log_path: Path) -> list[str]:
    return log_path.read_text(errors="replace").splitlines()


def _logged(log_path: Path, event: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The log's lines named ``event``, once there is one (the line may follow the answer's last byte)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in map(json.loads, _lines(log_path)) if line.get("event") == event]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_serve_logs_json_lines_with_the_served_requests_trace_id_and_no_secret(
    guarded_sidecar: servers.SidecarServer, vllm_server: servers.VllmServer
) -> None:
    """Every stderr line of `serve` is a JSON object from the first one on, without the scheduler's job lines at
    the default level; a line logged while a request was served names that request's trace id; and neither the
    HMAC key, the admin token nor the client's Authorization value appears anywhere."""
    status, trace_id, body = _signed_stream(guarded_sidecar, vllm_server.model_name)
    assert status == 200
    assert b'"type":"upstream_event_too_large"' in body.replace(b" ", b"")  # the stream failed after it started
    admin = urllib.request.Request(guarded_sidecar.base_url + "/admin/alerts",
                                   headers={"Authorization": f"Bearer {ADMIN_TOKEN.decode()}"})
    with urllib.request.urlopen(admin, timeout=10) as response:
        assert response.status == 200
    unsigned = urllib.request.Request(guarded_sidecar.base_url + "/v1/models",
                                      headers={"Authorization": f"Bearer {API_KEY}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(unsigned, timeout=10)
    assert refused.value.code == 401

    (failure,) = _logged(guarded_sidecar.process.log_path, "upstream_event_too_large")
    assert failure["trace_id"] == trace_id
    assert failure["level"] == "warning"

    lines = _lines(guarded_sidecar.process.log_path)
    events = [json.loads(line) for line in lines]  # every line, the first included, is JSON
    assert all(isinstance(event, dict) for event in events)
    assert events[0]["event"] == "serving"
    assert not [e for e in events if str(e.get("logger", "")).startswith("apscheduler")]
    text = "\n".join(lines)
    for secret in (HMAC_KEY.decode(), ADMIN_TOKEN.decode(), API_KEY):
        assert secret not in text
