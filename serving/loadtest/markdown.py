"""``report.md``: the report document in words and tables, plots embedded."""

from __future__ import annotations

import time
from typing import Any

GROUPS = (("ttft_s", "TTFT"), ("itl_s", "inter-token"), ("e2e_s", "end-to-end"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _latency_cells(numbers: dict[str, Any]) -> list[str]:
    return [_ms(numbers[key][q]) for key, _ in GROUPS for q in ("p50", "p90", "p99")]


def _latency_header(first: list[str]) -> list[str]:
    header = " | ".join([*first, *(f"{name} {q} ms" for _, name in GROUPS for q in ("p50", "p90", "p99"))])
    return [f"| {header} |", "|" + "---|" * (len(first) + 9)]


def render(document: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    target = document["target"]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(document["started_unix"]))
    totals = document["totals"]
    lines = [
        "# Load test report", "",
        f"Target `{target['url']}`, model `{target['model']}`, {'streamed' if target['stream'] else 'not streamed'}; "
        f"started {started}, {document['wall_s']:.1f} s in all.", "",
        _options_line(document["options"]), "",
        "## Summary", "",
        f"- {totals['sent']} requests sent ({totals['retries']} of them retries: sent after a failed request, "
        f"once the worker had backed off), {totals['ok']} succeeded, {totals['failed']} failed; "
        f"{totals['prompt_tokens']} prompt and {totals['completion_tokens']} output tokens (usage of the answers).",
        f"- SLO (rules config): a request is good when it succeeds within {document['slo']['latency_s']:g} s; "
        f"a step meets the SLO when at least {document['slo']['objective']:.2%} of its requests are good.",
        *_capacity_lines(document),
        *(f"- Warning: {w}" for w in document["warnings"]), "",
    ]
    lines += _profile_lines(document)
    lines += ["## Steps", "", "| step | pace | sent | ok | failed | retries | req/s | output tok/s | goodput | SLO |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for step in document["steps"]:
        s, v = step["summary"], step["verdict"]
        lines.append(f"| {step['label']} | {step['pace']} | {s['requests']['sent']} | {s['requests']['ok']} | "
                     f"{s['requests']['failed']} | {s['retries']} | {s['requests_per_s']:.2f} | "
                     f"{s['output_tokens_per_s']:.1f} | "
                     f"{_share(v['goodput'])} | {'met' if v['meets_slo'] else 'missed'} |")
    lines += ["", *_latency_header(["step"])]
    lines += [f"| {step['label']} | " + " | ".join(_latency_cells(step["summary"])) + " |"
              for step in document["steps"]]
    lines += ["", "### Per length bucket", "", *_latency_header(["step", "bucket", "sent", "failed",
                                                                 "prompt tokens (mean)"])]
    for step in document["steps"]:
        for name, b in step["buckets"].items():
            mean = b["prompt_tokens"]["mean"]
            lines.append(f"| {step['label']} | {name} | {b['sent']} | {b['failed']} | "
                         f"{'-' if mean is None else f'{mean:.0f}'} | " + " | ".join(_latency_cells(b)) + " |")
    lines += ["", "### Errors", ""]
    errors = [(step["label"], kind, count, step["summary"]["error_details"].get(kind, ""))
              for step in document["steps"] for kind, count in step["summary"]["errors"].items()]
    lines += [f"- {label}: {kind} x{count} ({detail})" for label, kind, count, detail in errors] or ["None."]
    lines += ["", *_long_context_lines(document), *_cold_start_lines(document)]
    lines += ["## Plots", ""]
    lines += [f"![{p['title']}]({p['file']})" + "\n" for p in document.get("plots", [])]
    lines += ["## Engine and GPU", "", _timeline_line(document), f"GPU: {document['gpu']['note']}.", "",
              "The raw samples of every request are in `report.json` (`samples`)."]
    return "\n".join(lines) + "\n"


def _options_line(options: dict[str, Any]) -> str:
    given = [f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}")
             for name, value in options.items() if value not in (None, False, "", ())]
    return f"Options: `{' '.join(given)}`" if given else ""


def _capacity_lines(document: dict[str, Any]) -> list[str]:
    best = document["capacity"]
    if best is None:
        return ["- Capacity: no step met the SLO (the first step already missed it)."]
    if best["lower_bound"]:
        lines = [f"- Capacity: at least {best['rpm']:.1f} requests/min at step {best['step']} (no step missed the "
                 "SLO: the limit lies above the highest load tried; add a heavier step to find it)."]
    else:
        lines = [f"- Capacity: {best['rpm']:.1f} requests/min at step {best['step']} (the last step before the "
                 "first that missed the SLO)."]
    plan = document["provisioning"]
    if plan is not None:
        lines.append(f"- Provisioning for {plan['expected_rpm']:g} requests/min: with "
                     f"{plan['headroom_per_100_rpm']:.0%} headroom per 100 requests/min "
                     f"({plan['headroom_ratio']:.0%} here), {plan['needed_rpm']:.1f} requests/min are needed: "
                     + ("at most " if best["lower_bound"] else "")
                     + f"{plan['replicas']} deployment(s) like this one.")
    return lines


def _profile_lines(document: dict[str, Any]) -> list[str]:
    profile = document["profile"]
    lines = ["## What was sent", "", f"Profile: {profile['kind']}."]
    if "lengths" in profile:
        lines += ["", "| bucket | asked tokens | sent tokens (calibrated) | words | weight | share asked |",
                  "|---|---|---|---|---|---|"]
        for length in profile["lengths"]:
            tokens = "-" if length["tokens"] is None else length["tokens"]
            lines.append(f"| {length['bucket'] or 'by usage'} | {length['asked_tokens']} | {tokens} | "
                         f"{length['words']} | {length['weight']:g} | {length['share']:.1%} |")
    else:
        lines.append(", ".join(f"{k}: {v}" for k, v in profile.items() if k != "kind") + ".")
    calibration = document["calibration"]
    if calibration is not None:
        context = calibration["max_model_len"]
        lines += ["", f"Lengths calibrated by {calibration['method']} ({calibration['counts']} counts); "
                  f"max_model_len {context if context is not None else 'unknown'}."]
    return [*lines, ""]


def _long_context_lines(document: dict[str, Any]) -> list[str]:
    long = document["long_context"]
    if long is None:
        return []
    return ["## Long context", "", f"{long['requests']} consecutive requests at the model's maximum context: "
            f"{long['failed']} failed ({_share(long['failure_rate'])}); errors: {long['errors'] or 'none'}.", ""]


def _cold_start_lines(document: dict[str, Any]) -> list[str]:
    if not document["cold_starts"]:
        return []
    lines = ["## Cold starts", "", "| # | restart at s | ready after s | first token after s | failed requests | "
             "p99 before ms | p99 after ms | note |", "|---|---|---|---|---|---|---|---|"]
    for e in document["cold_starts"]:
        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        lines.append(f"| {e['number']} | {e['restart_s']:.1f} | {seconds(e['ready_after_s'])} | "
                     f"{seconds(e['first_token_after_s'])} | {e['failed_requests']} | {_ms(e['p99_before_s'])} "
                     f"({e['requests_before']}) | {_ms(e['p99_after_s'])} ({e['requests_after']}) | "
                     f"{e['error'] or ''} |")
    return [*lines, "", "Failed requests: those still running when the restart began or sent before ready; "
            "they are the failures the exit code excuses. p99 before/after: successful requests sent in the "
            "window before the restart and after ready (their count in brackets).", ""]


def _timeline_line(document: dict[str, Any]) -> str:
    timeline = document["timeline"]
    if timeline is None:
        return "No engine metrics were scraped."
    return (f"Engine metrics: {len(timeline['samples'])} scrapes of {timeline['url']} every "
            f"{timeline['interval_s']:g} s (values from {timeline['source']}; {timeline['failures']} failed).")
