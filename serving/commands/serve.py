"""`inferwatch serve`: run the sidecar in front of a vLLM server."""

from __future__ import annotations

import argparse

from serving.config import add_config_flags, settings_from_args

SHORTCUTS = {"upstream": "serve.upstream", "listen": "serve.listen", "workers": "serve.workers"}
CHATTY_LOGGERS = ("apscheduler",)
"""Libraries whose info lines (a line per scheduled job run) show only at ``--serve-log-level debug``."""


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
    parser.add_argument("--workers", metavar="N", help="processes answering on the listen port, to use more than "
                        "one core (serve.workers)")
    parser.add_argument("--worker-of", metavar="SOCKET", help=argparse.SUPPRESS)  # set by the primary
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the app and serve until SIGINT/SIGTERM (with ``--workers N``, N processes on one port)."""
    import asyncio
    import os

    import structlog
    import uvloop

    from log_pipeline.chain import configure_logging
    from serving.app import build_app, build_secondary_app, front_for, server_options
    from serving.workers import Secondaries, private_socket_path, serve_until_signal

    settings = settings_from_args(args, SHORTCUTS)
    configure_logging(settings.serve.log_level, chatty=CHATTY_LOGGERS)
    log = structlog.get_logger("serving.commands.serve")
    host, _, port = settings.serve.listen.rpartition(":")
    workers = settings.serve.workers
    secondaries = unix_path = None
    if args.worker_of:  # a secondary started by the primary
        structlog.contextvars.bind_contextvars(worker=args.worker_index)
        app = build_secondary_app(settings, args.worker_of, args.worker_index, os.getppid())
    else:
        app = build_app(settings)
        if workers > 1:
            unix_path = private_socket_path()
            secondaries = Secondaries(args.argv, workers, unix_path)
        log.info("serving", listen=f"http://{settings.serve.listen}", upstream=settings.serve.upstream,
                 metrics=f"http://{settings.serve.listen}/metrics", workers=workers)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve_until_signal(app, front_for(app), host, int(port), reuse_port=workers > 1, unix_path=unix_path,
                                      secondaries=secondaries, shutdown_timeout_s=5.0,
                                      server_options=server_options(settings)))
    return 0
