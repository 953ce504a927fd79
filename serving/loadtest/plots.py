"""The report's PNG plots, drawn from the report document with matplotlib (no pyplot state).

``throughput_vs_p99.png``: p99 end-to-end latency and p99 TTFT against successful requests/s,
one point per step, with the SLO's latency bound. ``latency_cdf.png``: the end-to-end latency
CDF of each length bucket. ``timeline.png``: per-request TTFT, the engine's queue and running
batch, KV-cache usage and preemptions over the run, with the start of each next step
(dash-dotted) and the cold starts (restart dashed, ready dotted) marked. ``gpu.png``: power and
temperature per GPU, when the metrics carried them. Every series has its own colour from
:data:`PALETTE`; axes, text, markers of events and the SLO bound are grey or black, so the
colours in an image are its series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#000080", "#808000", "#008080")
"""Series colours, in order (matplotlib's tab10 without its grey, then three darker ones)."""
EVENT_COLOR = "#000000"
BOUND_COLOR = "#999999"
DPI = 100


@dataclass(frozen=True, slots=True)
class Plot:
    """A written plot: its file name, title and the names of its series (in colour order)."""

    file: str
    title: str
    series: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"file": self.file, "title": self.title, "series": list(self.series)}


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, directory: Path, name: str) -> None:
    figure.savefig(directory / name, dpi=DPI, format="png")


def draw_all(document: dict[str, Any], directory: Path) -> list[Plot]:
    """Draw every plot the document has data for into ``directory``."""
    drawn = [throughput_vs_p99(document, directory), latency_cdf(document, directory),
             timeline(document, directory)]
    gpu = gpu_plot(document, directory)
    return [plot for plot in [*drawn, gpu] if plot is not None]


def throughput_vs_p99(document: dict[str, Any], directory: Path) -> Plot:
    """p99 latencies against throughput, one point per step."""
    steps = [s for s in document["steps"] if s["summary"]["requests"]["ok"]]
    figure = _figure(7, 4.5)
    axes = figure.add_subplot()
    series = []
    for color, (key, name) in zip(PALETTE, (("e2e_s", "p99 end-to-end"), ("ttft_s", "p99 TTFT")), strict=False):
        points = [(s["summary"]["requests_per_s"], s["summary"][key]["p99"], s["label"]) for s in steps
                  if s["summary"][key]["p99"] is not None]
        if not points:
            continue
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", linewidth=2, color=color, label=name)
        for x, y, label in points:
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        series.append(name)
    axes.axhline(document["slo"]["latency_s"], color=BOUND_COLOR, linestyle="--", linewidth=1,
                 label=f"SLO bound {document['slo']['latency_s']:g} s")
    axes.set_xlabel("throughput (successful requests/s)")
    axes.set_ylabel("latency (s)")
    axes.set_title("Throughput against p99 latency, per step")
    axes.grid(True, color="#dddddd")
    axes.legend(loc="upper left")
    _save(figure, directory, "throughput_vs_p99.png")
    return Plot("throughput_vs_p99.png", "Throughput against p99 latency", tuple(series))


def latency_cdf(document: dict[str, Any], directory: Path) -> Plot:
    """The end-to-end latency CDF of each length bucket."""
    groups: dict[str, list[float]] = {name: [] for name in document["totals"]["buckets"]}
    for sample in document["samples"]:
        if sample["error"] is None and sample["e2e_s"] is not None:
            groups.setdefault(sample["bucket"], []).append(sample["e2e_s"])
    figure = _figure(7, 4.5)
    axes = figure.add_subplot()
    groups = {name: values for name, values in groups.items() if values}
    for color, (name, values) in zip(PALETTE, groups.items(), strict=False):
        ordered = sorted(values)
        shares = [(k + 1) / len(ordered) for k in range(len(ordered))]
        axes.step(ordered, shares, where="post", linewidth=2, color=color, label=f"{name} ({len(ordered)})")
    axes.axvline(document["slo"]["latency_s"], color=BOUND_COLOR, linestyle="--", linewidth=1, label="SLO bound")
    axes.set_xlabel("end-to-end latency (s)")
    axes.set_ylabel("share of requests at or below")
    axes.set_ylim(0, 1.02)
    axes.set_title("End-to-end latency CDF per prompt length bucket")
    axes.grid(True, color="#dddddd")
    axes.legend(loc="lower right", title="bucket (requests)")
    _save(figure, directory, "latency_cdf.png")
    return Plot("latency_cdf.png", "Latency CDF per length bucket", tuple(list(groups)[:len(PALETTE)]))


def _mark_events(axes: Axes, document: dict[str, Any]) -> None:
    starts: dict[str, float] = {}
    for sample in document["samples"]:
        starts[sample["step"]] = min(starts.get(sample["step"], sample["sent_s"]), sample["sent_s"])
    for at in sorted(starts.values())[1:]:
        axes.axvline(at, color=BOUND_COLOR, linestyle="-.", linewidth=1)
    for event in document["cold_starts"]:
        axes.axvline(event["restart_s"], color=EVENT_COLOR, linestyle="--", linewidth=1)
        if event["ready_s"] is not None:
            axes.axvline(event["ready_s"], color=EVENT_COLOR, linestyle=":", linewidth=1)


def timeline(document: dict[str, Any], directory: Path) -> Plot:
    """TTFT per request, queue and batch, KV usage and preemptions over the run."""
    samples = document["timeline"]["samples"] if document["timeline"] else []
    figure = _figure(9, 9)
    panels = figure.subplots(4, 1, sharex=True)
    series: list[str] = []
    colors = iter(PALETTE)
    ok = [s for s in document["samples"] if s["error"] is None]
    streamed = [s for s in ok if s["ttft_s"] is not None]
    what, key = ("TTFT", "ttft_s") if streamed else ("end-to-end", "e2e_s")
    points = streamed or [s for s in ok if s["e2e_s"] is not None]
    if points:
        panels[0].plot([s["sent_s"] for s in points], [s[key] for s in points], linestyle="none", marker="o",
                       markersize=4, color=next(colors), label=f"{what} per request")
        series.append(f"{what} per request")
    panels[0].set_ylabel(f"{what} (s)")
    lines = (
        (panels[1], "waiting", "requests waiting"), (panels[1], "running", "requests running"),
        (panels[2], "kv_usage", "KV-cache usage"), (panels[3], "preemptions", "preemptions since start"),
    )
    for axes, field_name, label in lines:
        xy = [(s["t_s"], s[field_name]) for s in samples]
        color = next(colors)
        if all(value is None for _, value in xy):
            continue
        if field_name == "preemptions":
            xy = increase(xy)
        axes.plot([p[0] for p in xy], with_gaps([p[1] for p in xy]), linewidth=2, color=color, label=label)
        series.append(label)
    panels[1].set_ylabel("requests")
    panels[2].set_ylabel("KV usage (0-1)")
    panels[3].set_ylabel("preemptions")
    panels[3].set_xlabel("seconds since the start of the run (next step dash-dotted, restart dashed, ready dotted)")
    source = document["timeline"]["source"] if document["timeline"] else "none"
    for axes in panels:
        _mark_events(axes, document)
        axes.grid(True, color="#dddddd")
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="upper left")
    if not samples or source == "none":
        panels[2].text(0.5, 0.5, "no engine metrics were scraped", transform=panels[2].transAxes, ha="center")
    panels[0].set_title(f"The run over time (engine metrics from {source})")
    _save(figure, directory, "timeline.png")
    return Plot("timeline.png", "The run over time", tuple(series))


def with_gaps(values: list[float | None]) -> list[float]:
    """Missing values (a failed scrape, stale engine series) as NaN, where matplotlib breaks the line."""
    return [math.nan if value is None else value for value in values]


def increase(points: list[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """A counter's increase since its first point; a drop is a restart (the counter began again at 0).

    A missing value stays missing (a gap); the increase goes on from the last known value after it."""
    total, previous = 0.0, None
    out: list[tuple[float, float | None]] = []
    for t_s, value in points:
        if value is None:
            out.append((t_s, None))
            continue
        if previous is not None:
            total += value - previous if value >= previous else value
        previous = value
        out.append((t_s, total))
    return out


def gpu_plot(document: dict[str, Any], directory: Path) -> Plot | None:
    """Power and temperature per GPU over the run (None without GPU readings)."""
    samples = document["timeline"]["samples"] if document["timeline"] else []
    gpus = sorted({g for s in samples for g in (*s["gpu_power_w"], *s["gpu_temperature_c"])})
    if not gpus:
        return None
    figure = _figure(9, 6)
    power, temperature = figure.subplots(2, 1, sharex=True)
    series = []
    colors = iter(PALETTE)
    for axes, key, unit in ((power, "gpu_power_w", "W"), (temperature, "gpu_temperature_c", "°C")):
        for gpu in gpus:
            xy = [(s["t_s"], s[key][gpu]) for s in samples if gpu in s[key]]
            color = next(colors, EVENT_COLOR)
            if xy:
                name = f"GPU {gpu} {'power' if key == 'gpu_power_w' else 'temperature'}"
                axes.plot([p[0] for p in xy], [p[1] for p in xy], linewidth=2, color=color, label=name)
                series.append(name)
        axes.set_ylabel(unit)
        _mark_events(axes, document)
        axes.grid(True, color="#dddddd")
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="upper left")
    temperature.set_xlabel("seconds since the start of the run")
    power.set_title("GPU power and temperature")
    _save(figure, directory, "gpu.png")
    return Plot("gpu.png", "GPU power and temperature", tuple(series))

