"""The report of a load test as one JSON-ready document, and the report directory written from it.

The document holds every number (per step, per length bucket, capacity, provisioning, cold
starts, the engine timeline) and the raw per-request samples; ``report.md`` and the PNG plots
are rendered from it alone, so what people read and look at is what ``report.json`` says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporters.files import write_atomic
from exporters.records import length_bucket
from serving.loadtest import markdown, plots
from serving.loadtest.calibrate import Calibration
from serving.loadtest.capacity import Provisioning, SloTarget, capacity_document, judge
from serving.loadtest.client import RequestResult
from serving.loadtest.stats import Distribution, Latencies
from serving.loadtest.steps import LONG_CONTEXT_STEP, RunResult

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class ReportContext:
    """What the report needs beyond the run: the SLO, the provisioning question and what was found before it."""

    slo: SloTarget
    expected_rpm: float | None = None
    headroom_per_100_rpm: float = 0.10
    calibration: Calibration | None = None
    warnings: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    """The command-line options of the run, by name."""


def bucket_of(result: RequestResult) -> str:
    """The length bucket a request is filed under: its planned one, else that of its usage prompt length."""
    return result.bucket or length_bucket(result.prompt_tokens)


def by_bucket(results: Sequence[RequestResult]) -> dict[str, dict[str, Any]]:
    """Counts and latencies per length bucket, shortest prompts first."""
    groups: dict[str, list[RequestResult]] = {}
    for result in results:
        groups.setdefault(bucket_of(result), []).append(result)

    def shortest(item: tuple[str, list[RequestResult]]) -> float:
        return min((r.prompt_tokens for r in item[1] if r.prompt_tokens is not None), default=float("inf"))

    out = {}
    for name, group in sorted(groups.items(), key=shortest):
        latencies = Latencies.of(group)
        out[name] = {
            "sent": len(group), "failed": sum(1 for r in group if not r.ok),
            "prompt_tokens": Distribution.of([r.prompt_tokens for r in group if r.prompt_tokens is not None]).to_dict(),
            "ttft_s": latencies.ttft_s.to_dict(), "itl_s": latencies.itl_s.to_dict(),
            "e2e_s": latencies.e2e_s.to_dict(),
        }
    return out


def build_document(run: RunResult, context: ReportContext) -> dict[str, Any]:
    """Every number of the run, JSON-ready."""
    steps: list[dict[str, Any]] = []
    verdicts = []
    for spec, label, report in zip(run.plan.steps, run.plan.labels, run.steps, strict=False):
        verdict = judge(label, report.results, report.requests_per_s, context.slo)
        if label != LONG_CONTEXT_STEP:
            verdicts.append(verdict)
        steps.append({"label": label, "pace": spec.pace, "summary": report.to_dict(), "verdict": verdict.to_dict(),
                      "buckets": by_bucket(report.results)})
    results = run.results
    best = capacity_document(verdicts)
    provisioning = None
    if context.expected_rpm is not None and best is not None:
        provisioning = Provisioning(context.expected_rpm, context.headroom_per_100_rpm, best["rpm"]).to_dict()
    long_context = next((s for s in steps if s["label"] == LONG_CONTEXT_STEP), None)
    timeline = run.timeline.to_dict() if run.timeline is not None else None
    return {
        "schema_version": SCHEMA_VERSION,
        "options": dict(context.options),
        "target": {"url": run.plan.steps[0].url, "model": run.plan.steps[0].model,
                   "stream": run.plan.steps[0].stream},
        "started_unix": run.started_unix, "wall_s": run.wall_s,
        "profile": run.plan.source.describe(),
        "calibration": context.calibration.to_dict() if context.calibration is not None else None,
        "warnings": list(context.warnings),
        "slo": context.slo.to_dict(),
        "steps": steps,
        "totals": {"sent": len(results), "ok": sum(1 for r in results if r.ok),
                   "failed": sum(1 for r in results if not r.ok),
                   "retries": sum(1 for r in results if r.retry > 0),
                   "prompt_tokens": sum(r.prompt_tokens or 0 for r in results if r.ok),
                   "completion_tokens": sum(r.completion_tokens or 0 for r in results if r.ok),
                   "buckets": by_bucket(results)},
        "capacity": best,
        "expected_rpm": context.expected_rpm,
        "provisioning": provisioning,
        "long_context": None if long_context is None else {
            "requests": long_context["summary"]["requests"]["sent"],
            "failed": long_context["summary"]["requests"]["failed"],
            "failure_rate": _rate(long_context["summary"]["requests"]),
            "errors": long_context["summary"]["errors"]},
        "cold_starts": [event.to_dict() for event in run.cold_starts],
        "timeline": timeline,
        "gpu": _gpu_note(run),
        "samples": [{**r.to_dict(), "bucket": bucket_of(r)} for r in results],
    }


def _rate(requests: dict[str, int]) -> float | None:
    return requests["failed"] / requests["sent"] if requests["sent"] else None


def _gpu_note(run: RunResult) -> dict[str, Any]:
    if run.timeline is None:
        return {"available": False, "note": "no metrics were scraped during the run (--metrics-url none)"}
    if run.timeline.has_gpu:
        return {"available": True, "note": f"GPU power and temperature from {run.timeline.url}"}
    if run.timeline.source == "vllm":
        return {"available": False, "note": "the metrics came from vLLM itself, which has no GPU readings: load "
                "through the sidecar (inferwatch serve with NVML) for GPU power and temperature"}
    return {"available": False, "note": f"{run.timeline.url} carried no GPU readings: the sidecar has no NVML "
            "(no GPU or driver on its machine), or its [gpu] exporter is disabled"}


def write_report(directory: Path, document: dict[str, Any]) -> list[Path]:
    """Write the plots, ``report.md`` and ``report.json`` into ``directory``; return the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    drawn = plots.draw_all(document, directory)
    document["plots"] = [p.to_dict() for p in drawn]
    write_atomic(directory / "report.md", markdown.render(document))
    write_atomic(directory / "report.json", json.dumps(document, indent=1, sort_keys=False) + "\n")
    return [directory / p.file for p in drawn] + [directory / "report.md", directory / "report.json"]
