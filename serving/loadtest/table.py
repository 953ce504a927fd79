"""The terminal table of a load test: one block per step, then the cold starts."""

from __future__ import annotations

from serving.loadtest.spec import LoadSpec
from serving.loadtest.stats import Distribution, LoadReport
from serving.loadtest.steps import RunResult

SLOWEST_HINT = [
    "(each trace id: `inferwatch explain ID --sidecar URL` while the sidecar holds it (its newest",
    " serve.explain_ring_size requests); its span in the sidecar's trace backend; its log record in",
    " `inferwatch logs search --trace-id` only if the archive kept it: errors, requests over their SLA",
    " (rules.sla_default_s), logs.success_sample_ratio (5 %) of the rest; serve with",
    " --logs-success-sample-ratio 1 to keep every request of a load test)",
]
"""Where the slowest requests' trace ids lead: a successful one under its SLA is archived only if sampled."""


def format_run(run: RunResult) -> str:
    """The human-readable report of every step, and of the cold starts."""
    parts = []
    for number, (spec, label, report) in enumerate(zip(run.plan.steps, run.plan.labels, run.steps, strict=True), 1):
        header = f"== step {number}/{len(run.steps)}: {label}\n" if len(run.steps) > 1 else ""
        parts.append(header + format_report(spec, report))
    for event in run.cold_starts:
        def s(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f} s"

        note = f" ({event.error})" if event.error else ""
        parts.append(f"cold start {event.number}: restart at {event.restart_s:.1f} s, ready after "
                     f"{s(event.ready_after_s)}, first token after {s(event.first_token_after_s)}, "
                     f"{event.failed_requests} requests failed by it (running at the restart or sent before "
                     f"ready){note}")
    return "\n\n".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _row(name: str, d: Distribution) -> str:
    cells = (d.p50, d.p90, d.p99, d.mean, d.max)
    return f"{name:<8}" + "".join(f"{_ms(v):>10}" for v in cells) + f"{d.count:>8}"


def format_report(spec: LoadSpec, report: LoadReport) -> str:
    """The human-readable report of one step."""
    bound = " and ".join(part for part in (
        f"{spec.requests} requests" if spec.requests is not None else "",
        f"{spec.duration_s:g} s" if spec.duration_s is not None else "") if part)
    pace = f"at {spec.rate:g} requests/s (open loop)" if spec.rate is not None else \
        f"at concurrency {spec.concurrency}"
    per_request = report.tokens_per_request
    lines = [
        f"target      {report.url} (model {report.model}, {'streamed' if report.stream else 'not streamed'})",
        f"load        up to {bound} {pace}",
        f"requests    {report.sent} sent, {report.ok} ok, {report.failed} failed in {report.wall_s:.2f} s"
        + (f"; {report.retries} retries after a failure ({report.backoff_s:.1f} s backing off)"
           if report.retries else ""),
        f"throughput  {report.requests_per_s:.2f} ok requests/s, {report.output_tokens_per_s:.1f} output tokens/s",
        f"tokens      {report.prompt_tokens} prompt, {report.completion_tokens} output"
        + (f" (per request: min {per_request.min:g}, max {per_request.max:g})" if per_request.count else ""),
    ]
    if spec.rate is not None:
        lines.append(f"start lag   {report.max_start_lag_s * 1000:.1f} ms at most behind schedule")
    lines += ["", "ms      " + "".join(f"{h:>10}" for h in ("p50", "p90", "p99", "mean", "max")) + f"{'n':>8}",
              _row("TTFT", report.ttft_s), _row("ITL", report.itl_s), _row("e2e", report.e2e_s), ""]
    if report.errors:
        lines.append("errors")
        lines += [f"  {kind}: {count} ({report.error_details.get(kind, '')})" for kind, count in report.errors.items()]
    else:
        lines.append("errors      none")
    lines.append(f"slowest {'e2e ms':>10}  {'status':<17} trace_id")
    for slow in report.slowest:
        status = slow.error if slow.error and not slow.error.isdigit() else str(slow.status)
        lines.append(f"{'':8}{slow.e2e_s * 1000:>10.1f}  {status:<17} {slow.trace_id or '-'}")
    if report.sent and report.trace_ids_missing == report.sent:
        lines.append("(no x-trace-id in the answers: the target is not the sidecar)")
    elif any(slow.trace_id for slow in report.slowest):
        lines += SLOWEST_HINT
    return "\n".join(lines)
