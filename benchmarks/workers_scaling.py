"""Throughput of ``serve --workers 2`` against one process, when the sidecar is what limits it.

The shared peer bench drives the sidecar with a Python client and a Python upstream, which take
most of a 2-core machine themselves: no core is left for a second worker. Here both ends are C:
nginx serves a 64-event SSE stream and a JSON answer from files, and ``wrk`` (Debian package)
requests them through the sidecar over 64 keep-alive connections. Sidecars with 1 and 2 workers
run side by side and are measured in alternating rounds; req/s are medians over the rounds, and
CPU per request counts every process of the sidecar.

Every process stays in this script's session. With the kernel's autogroup scheduling a session is
one scheduling group: a sidecar started in a session of its own had its 2 workers share one group's
CPU against the group of nginx and wrk, whatever the number of workers.

    apt-get install -y nginx-light wrk
    .venv/bin/python benchmarks/workers_scaling.py [--rounds 3] [--seconds 8] [--write]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, publish, revision
from serving.tools.launcher import free_port, http_status

SECTION = "Using more than one core"
PATHS = {"stream": "/v1/stream", "non-stream": "/v1/answer"}


def upstream_files(root: Path) -> None:
    """A 64-event chat stream like vLLM's (with [DONE]) and a non-streamed answer."""
    (root / "v1").mkdir(parents=True)
    events = [json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m",
                          "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]},
                         separators=(",", ":")) for i in range(64)]
    (root / "v1" / "stream").write_text("".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n")
    (root / "v1" / "answer").write_text(json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "w " * 64}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 64, "total_tokens": 72}}))


def start_nginx(work: Path, port: int) -> subprocess.Popen[bytes]:
    root = work / "www"
    upstream_files(root)
    conf = work / "nginx.conf"
    conf.write_text(f"""daemon off; master_process off; worker_processes 1;
error_log {work}/error.log; pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{ access_log off; client_body_temp_path {work}; proxy_temp_path {work}; fastcgi_temp_path {work};
  uwsgi_temp_path {work}; scgi_temp_path {work}; keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; root {root};
    location = /v1/stream {{ default_type text/event-stream; }}
    location = /v1/answer {{ default_type application/json; }}
    location = /health {{ return 200 "ok"; }}
    location = /v1/models {{ default_type application/json; return 200 '{{"data": [{{"id": "m"}}]}}'; }} }} }}
""")
    process = subprocess.Popen(["nginx", "-p", str(work), "-c", str(conf)])
    wait_ready(f"http://127.0.0.1:{port}/health")
    return process


def start_sidecar(upstream: str, work: Path, workers: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
         "--workers", str(workers), "--logs-dir", str(work / f"logs-{workers}"), "--gpu-enabled", "false"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # this session: see the module docstring
    wait_ready(f"http://127.0.0.1:{port}/healthz")
    deadline = time.monotonic() + 60  # the secondaries listen a moment after the primary
    while len(psutil.Process(process.pid).children()) < workers - 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    return process, port


def wait_ready(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while http_status(url) != 200:
        if time.monotonic() > end:
            raise SystemExit(f"workers_scaling: {url} not ready within {deadline_s:.0f} s")
        time.sleep(0.2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (the workers)."""
    total = 0.0
    process = psutil.Process(pid)
    for each in (process, *process.children(recursive=True)):
        times = each.cpu_times()
        total += times.user + times.system
    return total


def wrk(url: str, seconds: int) -> tuple[float, int]:
    """req/s and requests done by wrk over 64 connections."""
    out = subprocess.run(["wrk", "-t", "1", "-c", "64", "-d", f"{seconds}s", url], capture_output=True, text=True,
                         check=True).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    done = re.search(r"(\d+) requests in", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if rate is None or done is None or errors is not None:
        raise SystemExit(f"workers_scaling: wrk failed or saw errors:\n{out}")
    return float(rate.group(1)), int(done.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8, help="seconds per measurement")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        print(f"workers_scaling: {', '.join(missing)} missing: apt-get install -y nginx-light wrk", file=sys.stderr)
        return 2
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="workers-scaling-") as tmp:
        work = Path(tmp)
        upstream_port = free_port()
        nginx = start_nginx(work, upstream_port)
        sidecars = {}
        try:
            for workers in (1, 2):
                sidecars[str(workers)] = start_sidecar(f"http://127.0.0.1:{upstream_port}", work, workers)
            targets = {"direct": (None, upstream_port), **sidecars}
            for mode, path in PATHS.items():
                for _, port in targets.values():  # warm-up
                    wrk(f"http://127.0.0.1:{port}{path}", 2)
                for round_ in range(args.rounds):
                    for name, (process, port) in targets.items():
                        before = cpu_seconds(process.pid) if process is not None else 0.0
                        rate, done = wrk(f"http://127.0.0.1:{port}{path}", args.seconds)
                        rates.setdefault((mode, name), []).append(rate)
                        if process is not None:
                            cpu.setdefault((mode, name), []).append((cpu_seconds(process.pid) - before) / done)
                        print(f"workers_scaling: {mode} round {round_ + 1} {name}: {rate:,.0f} req/s",
                              file=sys.stderr, flush=True)
        finally:
            for process, _ in sidecars.values():
                process.terminate()
                process.wait(timeout=30)
            nginx.terminate()
            nginx.wait(timeout=10)
    rows = []
    for mode in PATHS:
        direct = statistics.median(rates[mode, "direct"])
        one = statistics.median(rates[mode, "1"])
        for name in ("1", "2"):
            rate = statistics.median(rates[mode, name])
            rows.append(f"| {mode} | {name} | {rate:,.0f} | {rate / direct:.2f} | {rate / one:.2f}× | "
                        f"{statistics.median(cpu[mode, name]) * 1e6:,.0f} |")
        rows.append(f"| {mode} | direct (nginx) | {direct:,.0f} | 1.00 | | |")
    command = (f"`.venv/bin/python benchmarks/workers_scaling.py --rounds {args.rounds} --seconds {args.seconds}"
               " --write`")
    text = "\n".join([
        f"Command: {command} (revision {revision()}, {machine()}). nginx serves a 64-event SSE stream and a "
        "JSON answer from files, wrk requests them over 64 keep-alive connections, through sidecars with 1 and "
        "2 workers started side by side, alternating rounds, medians; CPU per request counts every process of "
        "the sidecar. Both ends are C programs (the \"vs direct\" column: the sidecar's rate against nginx's "
        "own). Every process runs in the script's session (one autogroup of the scheduler).",
        "",
        "| answer | workers | req/s | vs direct | vs 1 worker | sidecar CPU per request (µs) |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
    ])
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
