"""`inferwatch serve`: run the sidecar in front of a vLLM server."""

from __future__ import annotations

import argparse
import sys

from serving.config import add_config_flags, settings_from_args

SHORTCUTS = {"upstream": "serve.upstream", "listen": "serve.listen"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `serve` command."""
    parser = subparsers.add_parser(
        "serve",
        help="Run the measuring proxy in front of vLLM.",
        description="Reverse proxy for vLLM's OpenAI API that traces and measures every request, "
        "scrapes vLLM's /metrics, runs the exporters and the embedded rule engine, and writes request logs.",
    )
    parser.add_argument("--upstream", metavar="URL", help="vLLM base URL (serve.upstream), e.g. http://127.0.0.1:8000")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (serve.listen)")
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the app and serve until SIGINT/SIGTERM."""
    import uvloop
    from aiohttp import web

    from log_pipeline.chain import configure_logging
    from serving.app import build_app, server_options

    settings = settings_from_args(args, SHORTCUTS)
    configure_logging(settings.serve.log_level)
    host, _, port = settings.serve.listen.rpartition(":")
    app = build_app(settings)
    print(
        f"inferwatch serve: listening on http://{settings.serve.listen} -> {settings.serve.upstream} "
        f"(metrics at http://{settings.serve.listen}/metrics)",
        file=sys.stderr, flush=True,
    )
    web.run_app(app, host=host, port=int(port), print=None, shutdown_timeout=5, loop=uvloop.new_event_loop(),
                **server_options(settings))  # type: ignore[arg-type]
    return 0
