"""A paced stream's CPU in each proxy, split into user and kernel time, with the system calls it made.

The paced cells of "Proxy cost against peers" compare CPU per stream, user and kernel time
together. This splits it, for vllm-router, the raw relay, the bare forwarder and ``inferwatch
serve`` in front of the shared bench's fake upstream paced at 5 ms per chunk (64-chunk chat
streams at concurrency 16, rounds alternating the proxies): each proxy's user and system CPU
per stream (``/proc/PID/stat``, every thread). After the timed rounds, one more round per proxy
counts its system calls per stream with ``perf stat`` on the kernel's syscall tracepoints (counted
in the kernel, the process never stopped; needs perf and root, else that table is left out). The
kernel time is mostly the socket work of relaying the chunks; the user time is the proxy's own
code; the calls show what socket work and waking each one does.

    .venv/bin/python benchmarks/paced_cpu_split.py [--venv-root /tmp/ppb] [--rounds 5] [--streams 480] [--write]

vllm-router comes from the venv the shared bench's README installs (``ppb-vrouter-venv``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, interrupt_all, machine, percentile, publish, revision
from benchmarks.peer_overhead import peers_config
from benchmarks.proxy_profile import BENCH, drive, wait_ready
from serving.tools.launcher import free_port

SECTION = "A paced stream's CPU, user and kernel"
CHUNK_DELAY_MS = 5.0
CONCURRENCY = 16
WARM_UP = 64
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PROXIES = ("vllm-router", "raw relay", "bare forwarder", "inferwatch")
PEER_NAMES = {"raw relay": "raw-relay", "bare forwarder": "bare-forwarder", "inferwatch": "inferwatch"}
"""The Python proxies' names in benchmarks/peer_overhead.py's peers."""
COUNTED_STREAMS = 240
"""Streams of the round whose system calls are counted."""


def proxy_argv(name: str, upstream: str, port: int, venv_root: Path, workdir: Path) -> tuple[list[str], str]:
    """The command line of proxy ``name`` and the path it answers when ready: vllm-router as the shared bench starts
    it, the Python ones as "Proxy cost against peers" does (one definition, in benchmarks/peer_overhead.py)."""
    if name == "vllm-router":
        return [str(venv_root / "ppb-vrouter-venv" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port",
                str(port), "--worker-urls", upstream, "--policy", "round_robin", "--log-level", "warning",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                "--log-dir", str(workdir / "router")], "/health"
    peer = next(peer for peer in peers_config(workdir)["peers"] if peer["name"] == PEER_NAMES[name])
    return [arg.format(upstream=upstream, port=port) for arg in peer["argv"]], peer["ready_path"]


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far, every thread."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS_PER_S, int(fields[12]) / TICKS_PER_S


CALL_KINDS = (
    ("socket reads", ("read", "readv", "recvfrom", "recvmsg")),
    ("socket writes", ("write", "writev", "sendto", "sendmsg")),
    ("waits", ("epoll_wait", "epoll_pwait", "epoll_pwait2")),
    ("futex", ("futex",)),
)
"""The system calls counted, by kind (what the proxies here use to move bytes, wait for them and wake threads)."""


def counted_calls(pid: int, url: str, streams: int) -> dict[str, float]:
    """System calls per stream of the process ``pid`` (every thread), by kind, over ``streams`` streams."""
    events = [f"syscalls:sys_enter_{name}" for _, names in CALL_KINDS for name in names] + ["raw_syscalls:sys_enter"]
    counter = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(events), "-p", str(pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # attached
    asyncio.run(drive(url, True, streams, CONCURRENCY))
    counter.send_signal(signal.SIGINT)  # prints the counts and exits
    _, report = counter.communicate(timeout=30)
    counts: dict[str, int] = {}
    for line in report.splitlines():  # CSV: value,unit,event,...
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            counts[fields[2].partition("sys_enter_")[2] or "all"] = int(fields[0])
    if "all" not in counts:
        raise SystemExit(f"paced_cpu_split: perf stat counted nothing: {report.strip()[-300:]}")
    counted = {kind: sum(counts.get(name, 0) for name in names) / streams for kind, names in CALL_KINDS}
    counted["all"] = counts["all"] / streams
    return counted


def can_count_calls() -> bool:
    """perf is here and may read the syscall tracepoints (root, or a permissive perf_event_paranoid)."""
    if shutil.which("perf") is None:
        return False
    probe = subprocess.run(["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "true"],
                           check=False, capture_output=True, text=True)
    return probe.returncode == 0 and any(line.split(",")[0].isdigit() for line in probe.stderr.splitlines())


def measure(venv_root: Path, rounds: int, streams: int) -> tuple[dict[str, list[dict[str, float]]],
                                                                dict[str, dict[str, float]]]:
    """Each proxy's user and system µs per stream in each round (rounds alternate the proxies, all started once),
    and its system calls per stream (perf, when this machine lets it count them)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PROXIES}
    calls: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="paced-cpu-split-") as tmp:
        workdir = Path(tmp)
        upstream_port = free_port()
        upstream = f"http://127.0.0.1:{upstream_port}"
        processes = [subprocess.Popen([sys.executable, str(BENCH), "upstream", "--port", str(upstream_port),
                                       "--chunk-delay-ms", str(CHUNK_DELAY_MS)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        try:
            wait_ready(f"{upstream}/v1/models")
            urls: dict[str, tuple[str, int]] = {}
            for name in PROXIES:
                port = free_port()
                argv, ready = proxy_argv(name, upstream, port, venv_root, workdir)
                processes.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))
                urls[name] = (f"http://127.0.0.1:{port}", processes[-1].pid)
                wait_ready(urls[name][0] + ready)
                asyncio.run(drive(urls[name][0], True, WARM_UP, CONCURRENCY))
            for number in range(1, rounds + 1):
                for name, (url, pid) in urls.items():
                    user_before, system_before = cpu_s(pid)
                    asyncio.run(drive(url, True, streams, CONCURRENCY))
                    user_after, system_after = cpu_s(pid)
                    runs[name].append({"user": (user_after - user_before) / streams * 1e6,
                                       "system": (system_after - system_before) / streams * 1e6})
                print(f"paced_cpu_split: round {number}/{rounds}: " + ", ".join(
                    f"{name} {runs[name][-1]['user'] + runs[name][-1]['system']:,.0f} µs" for name in PROXIES),
                    file=sys.stderr, flush=True)
            if can_count_calls():
                for name, (url, pid) in urls.items():
                    calls[name] = counted_calls(pid, url, min(streams, COUNTED_STREAMS))
        finally:
            interrupt_all(processes)
    return runs, calls


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each proxy's median per figure over the rounds, and of the total (user + system) round by round."""
    out = {}
    for name, rounds in runs.items():
        figures = {key: percentile([r[key] for r in rounds], 0.5) for key in ("user", "system")}
        figures["total"] = percentile([r["user"] + r["system"] for r in rounds], 0.5)
        out[name] = figures
    return out


def report(runs: dict[str, list[dict[str, float]]], calls: dict[str, dict[str, float]], rounds: int,
           streams: int) -> str:
    """The section: the command, the tables, and what the split says about the sidecar against vllm-router."""
    m = medians(runs)
    router, relay, bare, ours = (m[name] for name in PROXIES)
    rows = [f"| {name} | {f['user']:,.0f} | {f['system']:,.0f} | {f['total']:,.0f} | "
            f"{f['total'] / router['total']:.2f}× |" for name, f in m.items()]
    totals = "; ".join(f"{name} " + ", ".join(f"{r['user'] + r['system']:,.0f}" for r in runs[name])
                       for name in PROXIES)
    own, path = ours["user"] - bare["user"], bare["user"] - relay["user"]
    split = (
        f"Kernel time: the sidecar {ours['system']:,.0f} µs a stream, the raw relay {relay['system']:,.0f}, "
        f"vllm-router {router['system']:,.0f}. User time: the sidecar {ours['user']:,.0f} µs a stream against "
        f"vllm-router's {router['user']:,.0f}; of it, the bare forwarder's request path takes {path:,.0f} µs above "
        f"the raw relay's {relay['user']:,.0f}, and the sidecar's own work (the SSE reader, the span, the metrics, "
        f"the record) {own:,.0f} µs above the forwarder's."
    )
    if ours["total"] > router["total"]:
        user_allowed = max(router["total"] - ours["system"], 0.0)
        split += (f" For the sidecar's total to be vllm-router's here, its user time would have to be "
                  f"{user_allowed:,.0f} µs a stream (vllm-router's total less the sidecar's kernel time), "
                  f"{1 - user_allowed / ours['user']:.0%} less than it is.")
    else:
        split += f" Here the sidecar's total is {ours['total'] / router['total']:.2f}× vllm-router's."
    lines = [
        f"Command: `.venv/bin/python benchmarks/paced_cpu_split.py --rounds {rounds} --streams {streams} --write` "
        f"(revision {revision()}, {machine()}); the shared bench's fake upstream paced at {CHUNK_DELAY_MS:g} ms per "
        f"chunk, 64-chunk chat streams at concurrency {CONCURRENCY}, {streams} streams a round after {WARM_UP} of "
        f"warm-up, {rounds} rounds alternating the proxies, medians; CPU from /proc/PID/stat (every thread of the "
        "process), per stream:",
        "",
        "| proxy | user CPU (µs) | kernel CPU (µs) | total (µs) | total / vllm-router |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Round by round, total µs per stream: {totals}.",
        "",
        split,
    ]
    if calls:
        kinds = [kind for kind, _ in CALL_KINDS]
        lines += [
            "",
            f"System calls per stream, one more round of {min(streams, COUNTED_STREAMS)} streams per proxy counted by "
            "`perf stat` on the kernel's syscall tracepoints (every thread; \"all\" is every system call):",
            "",
            "| proxy | " + " | ".join(kinds) + " | all |",
            "|---|" + "---:|" * (len(kinds) + 1),
            *(f"| {name} | " + " | ".join(f"{counted[kind]:.1f}" for kind in kinds) + f" | {counted['all']:.1f} |"
              for name, counted in calls.items()),
            "",
            calls_line(calls),
        ]
    return "\n".join(lines)


def calls_line(calls: dict[str, dict[str, float]]) -> str:
    """What the counts say: the sidecar's socket calls against the raw relay's, vllm-router's waking of threads."""
    router, relay, ours = calls["vllm-router"], calls["raw relay"], calls["inferwatch"]
    socket = {name: c["socket reads"] + c["socket writes"] for name, c in calls.items()}
    same = abs(socket["inferwatch"] - socket["raw relay"]) <= 0.05 * socket["raw relay"]
    return (
        f"The sidecar makes {ours['socket reads']:.0f} socket reads and {ours['socket writes']:.0f} writes a "
        f"stream, the raw relay {relay['socket reads']:.0f} and {relay['socket writes']:.0f}"
        + (" (the same socket work: one read from the upstream and one write to the client per chunk)" if same
           else "") + f"; vllm-router {router['socket reads']:.0f} and {router['socket writes']:.0f}, and "
        f"{router['futex']:.0f} futex calls a stream waking its threads. In all, {ours['all']:.0f} system calls a "
        f"stream for the sidecar, {relay['all']:.0f} for the raw relay, {router['all']:.0f} for vllm-router."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv-root", type=Path, default=Path("/tmp/ppb"), help="where ppb-vrouter-venv is")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each proxy once a round (default 5)")
    parser.add_argument("--streams", type=int, default=480, help="timed streams per proxy and round (default 480)")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    router = args.venv_root / "ppb-vrouter-venv" / "bin" / "vllm-router"
    if not router.exists() or not BENCH.exists():
        print(f"paced_cpu_split: needs {router} and {BENCH}; see ../shared/tools/README.md", file=sys.stderr)
        return 2
    runs, calls = measure(args.venv_root, args.rounds, args.streams)
    publish(SECTION, report(runs, calls, args.rounds, args.streams), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
