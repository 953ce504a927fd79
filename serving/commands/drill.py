"""`inferwatch drill kill`: SIGKILL the engine under a steady load and measure the recovery."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from serving.loadtest.coldstart import shell_restart
from serving.loadtest.drill import DrillResult, DrillSpec, find_process, kill_drill
from serving.loadtest.spec import check_range, check_url

KILL_HELP = """Send a steady closed-loop load (--concurrency, small streamed requests) to --url for
--before seconds, SIGKILL the process given by --pid or --match (a regular expression matched
against command lines; it must match exactly one, e.g. 'VLLM::EngineCore', the process an OOM
kill hits), run --restart-cmd, and measure: time to ready (GET --health-path answers 200 again),
time to the first good token, requests failed, and, through the sidecar (--sidecar, default
--url), whether it counted the restart (inferwatch_upstream_process_restarts_total) and which
alerts of its embedded rule engine went pending or firing. The load goes on for --after seconds
after the first good token.
Exit 0 when the engine recovered, 1 when it did not (never ready, or no token after ready)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `drill` command group."""
    parser = subparsers.add_parser("drill", help="Recovery drills against a running deployment.",
                                   description="Recovery drills: break the engine on purpose and measure how it "
                                   "comes back.")
    commands = parser.add_subparsers(dest="drill_command", metavar="SUBCOMMAND", required=True)
    kill = commands.add_parser("kill", help="SIGKILL the engine under load, restart it, measure the recovery.",
                               description=KILL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                               usage_flags=("--pid", "--match", "--sidecar", "--json"))
    which = kill.add_mutually_exclusive_group(required=True)
    which.add_argument("--pid", type=int, metavar="PID", help="The process to SIGKILL.")
    which.add_argument("--match", metavar="PATTERN", help="Regular expression matching exactly one command line.")
    kill.add_argument("--restart-cmd", required=True, metavar="CMD", help="Shell command that restarts the engine.")
    kill.add_argument("--url", required=True, metavar="URL", help="Where the load goes (vLLM or the sidecar).")
    kill.add_argument("--model", required=True, metavar="M", help="The served model name.")
    kill.add_argument("--sidecar", metavar="URL", help="The sidecar to read restarts and alerts from (default --url).")
    load = kill.add_argument_group("the load and the waits")
    load.add_argument("--health-path", default="/health", metavar="PATH",
                      help="Readiness path on --url (default /health; /readyz on the sidecar).")
    load.add_argument("--concurrency", type=int, default=2, metavar="C", help="Steady load (default 2).")
    load.add_argument("--max-tokens", type=int, default=32, metavar="T", help="max_tokens per request (default 32).")
    load.add_argument("--before", type=float, default=10.0, metavar="S", help="Seconds of load before the kill "
                      "(default 10).")
    load.add_argument("--after", type=float, default=10.0, metavar="S",
                      help="Seconds of load after the first good token (default 10).")
    load.add_argument("--timeout", type=float, default=600.0, metavar="S",
                      help="Seconds the engine may take to be ready again (default 600).")
    kill.add_argument("--json", action="store_true", help="Print one JSON object instead of lines.")
    kill.set_defaults(func=run_kill)


def run_kill(args: argparse.Namespace) -> int:
    """Run `inferwatch drill kill`; exit 0 when the engine recovered."""
    check_url(args.url)
    check_range("--concurrency", args.concurrency, 1, 256)
    check_range("--before", args.before, 0.0, 3600.0)
    check_range("--after", args.after, 0.0, 3600.0)
    check_range("--max-tokens", args.max_tokens, 1, 1_048_576)
    process = find_process(args.pid, args.match)
    spec = DrillSpec(args.url, args.model, shell_restart(args.restart_cmd, timeout_s=args.timeout),
                     sidecar_url=args.sidecar or args.url, health_path=args.health_path,
                     concurrency=args.concurrency, max_tokens=args.max_tokens, before_s=args.before,
                     after_s=args.after, ready_deadline_s=args.timeout)

    def say(line: str) -> None:
        if not args.json:
            print(f"drill: {line}", file=sys.stderr, flush=True)

    result = asyncio.run(kill_drill(spec, process, say=say))
    print(json.dumps(result.to_dict()) if args.json else format_drill(result))
    return 0 if result.recovered else 1


def format_drill(result: DrillResult) -> str:
    """The drill's findings as lines."""
    recovery = result.recovery

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    lines = [f"killed      pid {result.pid} ({result.command[:100]})"]
    if recovery is not None:
        lines += [f"ready       {seconds(recovery.ready_after_s)} after the kill",
                  f"first token {seconds(recovery.first_token_after_s)} after the kill"]
        if recovery.error:
            lines.append(f"problem     {recovery.error}")
    lines.append(f"requests    {len(result.results)} sent, {result.failed} failed")
    counted = result.restarts_counted
    if counted is None:
        lines.append(f"sidecar     {result.sidecar_note or 'not read'}")
    else:
        seen = ", ".join(f"{reason} +{delta:g}" for reason, delta in counted.items()) or "no restart series"
        lines.append(f"restarts    counted by the sidecar: {seen}")
        fired = ", ".join(f"{name} ({state})" for name, state in sorted(result.alerts.items())) or "none"
        lines.append(f"alerts      {fired}")
    lines.append(f"verdict     {'recovered' if result.recovered else 'NOT recovered'}")
    return "\n".join(lines)
