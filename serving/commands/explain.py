"""`inferwatch explain TRACE_ID` and `inferwatch explain --slowest N --since D`: why a request was slow.

The sidecar is asked first (its ring of recent requests, ``GET /admin/requests/...``), then the
request-log archive given with ``--dir``. Exit 0 when found, 1 when not (saying where it looked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from alert_rules.engine import parse_duration_ms
from exporters.errors import InferwatchError
from exporters.explain import (
    SLOWEST_MAX,
    EngineContext,
    cold_starts_from_json,
    explain,
    facts_from_json,
    facts_from_log_event,
    slowest_row,
)
from log_pipeline.errors import ArchiveError
from log_pipeline.query import Archive, Filter, ts_ms
from serving.commands import duration_arg
from serving.commands.logs import trace_id
from serving.explain_prometheus import PrometheusContextError, context_from_prometheus
from serving.signing import read_secret_file

DEFAULT_SIDECAR = "http://127.0.0.1:9100"
SIDECAR_TIMEOUT_S = 10.0
BAR_WIDTH = 40
HELP = """Explain one request: its time split into parts that add up to its end-to-end latency (the
sidecar, connecting, vLLM's front end, the engine's queue, prefill and decode, a slow-reading client),
the engine's state around it and the ranked causes. The sidecar's ring of recent requests is asked
first (--sidecar), then the request-log archive (--dir); with --prometheus, the engine's state around the
request comes from that Prometheus. With --slowest N --since D: the N slowest requests of the last D, each
with the engine's state around it (running, waiting, KV usage, vLLM's preemptions; from Prometheus with
--prometheus) and a one-line reason. Exit 0 when found, 1 when not (saying where it looked); 0 too when
Prometheus cannot be asked: stderr says why and the sidecar's context stays. The JSON schema is in the
README, "Explain a request"."""
NEXT_STEP = {
    "upstream_error": "its log record (inferwatch logs search --trace-id ID) and vLLM's own log around that time",
    "cold_start": "/readyz's recent_cold_starts, and `inferwatch warmup` after restarts",
    "upstream_restart": "the kill-drill numbers (`inferwatch drill kill`) and vLLM's log for why it went down",
    "preempted": "the engine board's KV-cache and preemption panels: fewer long requests at once or more KV blocks",
    "queue_full_batch": "the engine board's queue and batch panels: a larger --max-num-seqs if KV allows, or more "
    "replicas",
    "queue_kv_capacity": "the engine board's KV-cache panels: more KV blocks (--gpu-memory-utilization) or shorter "
    "contexts",
    "long_prefill": "the engine board's prefill panels by length bucket: prefix caching for repeated prompts, or "
    "chunked prefill",
    "decode_contention": "the inter-token latency panels: a smaller batch (--max-num-seqs) for latency, or more "
    "replicas",
    "stall": "the engine board around that moment and vLLM's log (a stalled step: GC, swap, a host CPU spike)",
    "gpu_throttled": "the GPU board's temperature, power and clock-event panels (cooling, power limit, "
    "nvidia-smi -q -d PERFORMANCE)",
    "client_slow_read": "the client: it read its stream slower than vLLM wrote it",
    "sidecar": "the sidecar's own board (its CPU, serve --workers)",
    "none": "nothing: it was an ordinary request; `inferwatch explain --slowest 10 --since 15m` lists slower ones",
}


class RequestNotFoundError(InferwatchError, LookupError):
    """The request is in none of the places looked in; the message names them (exit 1)."""


def _get_json(url: str, token: bytes | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token.decode()}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),  # noqa: S310 - the user's own --sidecar URL, opened for that user
                                    timeout=SIDECAR_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read())
        except ValueError:
            return err.code, {}


def _from_sidecar(args: argparse.Namespace, path: str, where: list[str]) -> dict[str, Any] | None:
    base = args.sidecar
    url = base.rstrip("/") + path
    token = read_secret_file(args.admin_token_file, "--admin-token-file", "token") if args.admin_token_file else None
    try:
        status, body = _get_json(url, token)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        where.append(f"the sidecar at {base} could not be asked ({reason})")
        return None
    if status == 200:
        return body
    message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else None
    where.append(f"the sidecar at {base}: HTTP {status}{f' ({message})' if message else ''}")
    return None


def _explain_event(event: dict[str, Any]) -> dict[str, Any]:
    end_ms = ts_ms(event.get("ts")) or 0
    start_unix = end_ms / 1000.0 - float(event.get("e2e_ms") or 0.0) / 1000.0
    context = EngineContext("none", note="an archived record: the sidecar's history around it is not read")
    return explain(facts_from_log_event(event, start_unix), context, source="archive")


def _find_one(args: argparse.Namespace) -> dict[str, Any]:
    where: list[str] = []
    found = _from_sidecar(args, f"/admin/requests/{args.trace_id}", where)
    if found is not None:
        return found
    if args.dir:
        try:
            events = list(Archive(args.dir).find(args.trace_id))
        except (ArchiveError, OSError) as err:
            where.append(f"the archive {args.dir} could not be read ({err})")
        else:
            if events:
                return _explain_event(events[-1])
            where.append(f"the archive {args.dir} has no record of it")
    else:
        where.append("no archive searched (--dir not given)")
    raise RequestNotFoundError(f"trace {args.trace_id} not found: " + "; ".join(where))


def _slowest(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The ``--slowest`` list, and the explanations it was made from where they are at hand (the archive's, by
    trace id; the sidecar sends rows only)."""
    where: list[str] = []
    query = {"slowest": str(args.slowest), "since": args.since} | ({"model": args.model} if args.model else {})
    found = _from_sidecar(args, "/admin/requests?" + urllib.parse.urlencode(query), where)
    if found is not None and found["requests"]:
        return found | {"source": "ring"}, {}
    if found is not None:
        where.append(f"the sidecar at {args.sidecar} has no request in the last {args.since}")
    if args.dir:
        since_ms = round(time.time() * 1000) - parse_duration_ms(args.since)
        events = [e for e in Archive(args.dir).records(Filter(since_ms=since_ms))
                  if args.model is None or e.get("model") == args.model]
        events.sort(key=lambda e: float(e.get("e2e_ms") or 0.0), reverse=True)
        explained = [_explain_event(event) for event in events[:args.slowest]]
        if explained:
            return {"source": "archive", "requests": [slowest_row(e) for e in explained]}, {
                e["trace_id"]: e for e in explained}
        where.append(f"the archive {args.dir} has no record in the last {args.since}")
    else:
        where.append("no archive searched (--dir not given)")
    raise RequestNotFoundError("no request found: " + "; ".join(where))


def _bar(share: float) -> str:
    eighths = round(share * BAR_WIDTH * 8)
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def render(explanation: dict[str, Any]) -> str:
    """The explanation as text for a terminal: one aligned bar per phase, the causes, what to look at next."""
    e = explanation
    source = "the sidecar's ring" if e["source"] == "ring" else "the archive"
    ttft = f"  TTFT {e['ttft_ms']:,.1f} ms" if e["ttft_ms"] is not None else ""
    lines = [f"trace {e['trace_id']}  {e['model']}  {e['route']}  {e['outcome']} {e['http_status']}  "
             f"e2e {e['e2e_ms']:,.1f} ms{ttft}  (from {source})"]
    width = max(len(p["name"]) for p in e["phases"])
    for phase in e["phases"]:
        note = ""
        if phase["name"] in ("decode", "generation") and e["largest_gap_ms"] is not None:
            note = f"  largest gap {e['largest_gap_ms']:,.1f} ms"
        peer = e.get("peers", {}).get(phase["name"])
        if peer is not None and peer["ratio"] is not None:
            note += f"  {peer['ratio']:,.1f}x the bucket's p50 ({peer['p50_ms']:,.1f} ms)"
        if not phase["split"]:
            note += "  (not split without vLLM's plugin)" if phase["name"] != "sidecar_and_vllm_front_end" \
                else "  (the archive does not split it)"
        lines.append(f"  {phase['name']:<{width}}  {phase['ms']:>10,.1f} ms  {phase['share']:>6.1%}  "
                     f"{_bar(phase['share'])}{note}")
    peer = e.get("peers", {}).get("e2e")
    if peer is not None and peer["ratio"] is not None:
        lines.append(f"  e2e {peer['ratio']:,.1f}x the p50 of {e['model']}'s {e['length_bucket']} requests over the "
                     f"last hour ({peer['p50_ms']:,.1f} ms)")
    causes = e["causes"]
    lines.append("Why: " + "; ".join(c["text"] for c in causes[:3]) + ".")
    context = e["context"]
    if context["source"] != "none":
        known = [f"{label} {context[key]:g}{suffix}" for key, label, suffix in (
            ("running_max", "running up to", ""), ("waiting_max", "waiting up to", ""),
            ("waiting_deferred_max", "deferred up to", ""),
            ("kv_usage_max", "KV usage up to", ""), ("preemptions_in_window", "vLLM preemptions around it", ""),
            ("max_num_seqs", "max_num_seqs", f" ({context.get('max_num_seqs_source') or 'rules.max_num_seqs'})"),
            ("in_flight_max", "in the sidecar up to", ""),
            ("gpu_utilization_max", "GPU utilisation up to", ""), ("gpu_temperature_max", "GPU temperature up to",
                                                                   " °C"))
            if context.get(key) is not None]
        alongside = context.get("alongside")
        if alongside and alongside["requests"]:
            known.append(f"{alongside['requests']} other requests in the sidecar meanwhile (prompts "
                         f"{alongside['prompt_tokens']:,} tokens, the longest {alongside['prompt_tokens_max']:,})")
        elif alongside:
            known.append("no other request in the sidecar meanwhile")
        if context.get("gpu_clock_events"):
            known.append("GPU clock events " + ", ".join(context["gpu_clock_events"]))
        lines.append(f"Around it ({context['source']}): " + (", ".join(known) or "nothing recorded"))
    if e["engine_numbers"] is False:
        lines.append("vLLM's own phases are missing: run its stat-logger plugin (README, \"vLLM's own numbers\").")
    lines.append(f"Next: {NEXT_STEP.get(causes[0]['cause'], NEXT_STEP['none'])}.")
    return "\n".join(lines)


def _with_prometheus(explanation: dict[str, Any], prometheus: str) -> dict[str, Any]:
    """The explanation again, with the engine's state around the request from Prometheus (the sidecar's
    ``max_num_seqs`` and cold starts kept).

    Raises:
        PrometheusContextError: Prometheus could not be asked or refused a query.
    """
    facts = facts_from_json(explanation["facts"])
    known = explanation["context"]
    context = context_from_prometheus(prometheus, facts.model, facts.start_unix, facts.end_unix,
                                      max_num_seqs=known.get("max_num_seqs"), cold_starts=cold_starts_from_json(known))
    context = dataclasses.replace(context, max_num_seqs_source=known.get("max_num_seqs_source"))
    peers = {part: peer["p50_ms"] for part, peer in explanation["peers"].items()}
    return explain(facts, context, source=explanation["source"], peers_p50_ms=peers)


def _one_with_prometheus(explanation: dict[str, Any], prometheus: str) -> dict[str, Any]:
    """:func:`_with_prometheus`, or the explanation as it was when Prometheus cannot be asked (stderr says why)."""
    try:
        return _with_prometheus(explanation, prometheus)
    except PrometheusContextError as err:
        print(f"inferwatch explain: {err}; the context stays {explanation['context']['source']}'s", file=sys.stderr)
        return explanation


def _slowest_with_prometheus(args: argparse.Namespace, listing: dict[str, Any],
                             explained: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``--slowest`` rows again, each explained with the engine's state around its request from Prometheus
    (its explanation asked of the sidecar again, which has its facts). When Prometheus cannot be asked, stderr says
    why once and the rows keep the context they were listed with; a request that left the ring meanwhile too."""
    rows, failed, total = [], False, len(listing["requests"])
    progress = sys.stderr.isatty()  # a line that counts the requests, on a terminal
    for index, row in enumerate(listing["requests"]):
        if progress:
            print(f"\rinferwatch explain: asking Prometheus about request {index + 1} of {total}", end="",
                  file=sys.stderr, flush=True)
        explanation = None if failed else explained.get(row["trace_id"]) or _from_sidecar(
            args, f"/admin/requests/{row['trace_id']}", [])
        try:
            rows.append(row if explanation is None else slowest_row(_with_prometheus(explanation, args.prometheus)))
        except PrometheusContextError as err:
            if progress:
                print(file=sys.stderr)  # end the progress line
            print(f"inferwatch explain: {err}; the rows keep the context they were listed with", file=sys.stderr)
            failed, progress = True, False
            rows.append(row)
    if progress:
        print(file=sys.stderr)
    return listing | {"requests": rows}


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def slowest_table(rows: list[dict[str, Any]]) -> str:
    """The ``--slowest`` list for a terminal: one line per request, slowest first, with the engine's state around it
    (the most running and waiting, the highest KV usage, vLLM's preemptions in its window, and where those came
    from; ``-`` where unknown) and its reason."""
    lines = [f"{'TRACE_ID':<32}  {'E2E_MS':>10}  {'CAUSE':<18}  {'RUNNING':>7}  {'WAITING':>7}  {'KV':>5}  "
             f"{'PREEMPTED':>9}  {'CONTEXT':<13}  REASON"]
    for row in rows:
        context = row.get("context") or {}
        lines.append(f"{row['trace_id']:<32}  {row['e2e_ms']:>10,.1f}  {row['cause']:<18}  "
                     f"{_cell(context.get('running_max'), 'd'):>7}  {_cell(context.get('waiting_max'), 'd'):>7}  "
                     f"{_cell(context.get('kv_usage_max'), '.2f'):>5}  "
                     f"{_cell(context.get('preemptions_in_window'), 'g'):>9}  {context.get('source', '-'):<13}  "
                     f"{row['reason']}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if (args.trace_id is None) == (args.slowest is None):
        print("inferwatch explain: give a TRACE_ID or --slowest N (not both)", file=sys.stderr)
        return 2
    if args.trace_id is not None:
        result = _find_one(args)  # RequestNotFoundError: exit 1
        if args.prometheus:
            result = _one_with_prometheus(result, args.prometheus)
    else:
        result, explained = _slowest(args)
        if args.prometheus:
            result = _slowest_with_prometheus(args, result, explained)
    if args.json:
        print(json.dumps(result))
    elif args.trace_id is not None:
        print(render(result))
    else:
        print(slowest_table(result["requests"]))
    return 0



def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= SLOWEST_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count between 1 and {SLOWEST_MAX}")
    return int(text)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `explain` command."""
    parser = subparsers.add_parser("explain", help="Why was this request slow: phases, context and causes.",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_id", nargs="?", type=trace_id, metavar="TRACE_ID",
                        help="The request's trace id (32 hex digits, as in the x-trace-id header).")
    parser.add_argument("--slowest", type=_count, metavar="N", help="List the N slowest requests instead.")
    parser.add_argument("--since", default="15m", type=duration_arg, metavar="DURATION",
                        help="With --slowest: how far back (15m, 2h; default 15m).")
    parser.add_argument("--model", metavar="M", help="With --slowest: only this model's requests.")
    parser.add_argument("--sidecar", default=DEFAULT_SIDECAR, metavar="URL",
                        help=f"The sidecar's base URL (default {DEFAULT_SIDECAR}).")
    parser.add_argument("--admin-token-file", metavar="PATH",
                        help="A file holding the sidecar's serve.admin_token_file token, sent as a bearer token: "
                        "needed when the sidecar is not on this machine's loopback (the /admin access rule).")
    parser.add_argument("--dir", metavar="ARCHIVE", help="The request-log archive to search next.")
    parser.add_argument("--prometheus", metavar="URL",
                        help="Read the engine's state around the request (each listed request with --slowest) from "
                        "this Prometheus (it scrapes vLLM and the sidecar) instead of the sidecar's own history.")
    parser.add_argument("--json", action="store_true", help="The explanation as JSON (schema inferwatch.explain/1).")
    parser.set_defaults(func=_run)
