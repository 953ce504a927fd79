"""`inferwatch metrics derive FILE [--json]`: the normalized engine view of a saved vLLM /metrics text."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_FIELDS = (
    ("generation", "generation"), ("models", "models"), ("engines", "engines"), ("running", "running"),
    ("waiting", "waiting"), ("swapped", "swapped"), ("preemptions", "preemptions"),
    ("kv_usage", "KV usage"), ("blocks_total", "blocks total"), ("blocks_used", "blocks used"),
    ("block_size", "block size"), ("capacity_tokens", "capacity tokens"),
    ("prefix_hit_ratio", "prefix hit ratio"), ("prefill_seconds", "prefill seconds"),
    ("decode_seconds", "decode seconds"), ("prefill_share", "prefill share"),
    ("waiting_by_reason", "waiting reasons"), ("admission_rejections", "vLLM rejections"),
    ("kv_offload", "KV offload"), ("parse_errors", "parse errors"), ("unknown_families", "unknown families"),
    ("missing", "unknown here"),
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `metrics` command group."""
    parser = subparsers.add_parser("metrics", help="Work with vLLM /metrics expositions.")
    sub = parser.add_subparsers(dest="metrics_command", metavar="SUBCOMMAND", required=True)
    derive = sub.add_parser(
        "derive", help="Print the normalized view (generation, requests, waiting by reason, admission "
        "rejections, KV blocks, KV offload, prefix hits, prefill/decode time, what the engine does not export) "
        "of one saved vLLM, SGLang or llama.cpp /metrics text ('-' reads stdin).",
    )
    derive.add_argument("file", metavar="FILE")
    derive.add_argument("--json", action="store_true", help="One JSON object; null where the text does not say.")
    derive.set_defaults(func=_derive)


def _read(name: str) -> str | None:
    """The text of FILE ('-': stdin); None, with the file and the problem on stderr, when it cannot be read."""
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        print(f"inferwatch: cannot read {name}: {err.strerror or err}", file=sys.stderr)
        return None


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_show(v)}" for k, v in value.items()) or "-"
    return str(value)


def _derive(args: argparse.Namespace) -> int:
    from exporters.catalog.engines import KV_USAGE_SIGNAL
    from exporters.derive import normalized
    from exporters.engine_parse import parse_engine_exposition

    text = _read(args.file)
    if text is None:
        return 2  # bad usage: the file given cannot be read
    view = normalized(parse_engine_exposition(text))  # vLLM's, SGLang's or llama.cpp's, by its families
    if args.json:
        print(json.dumps(view, sort_keys=False))
    else:
        width = max(len(label) for _, label in _FIELDS)
        missing = view["missing"]
        assert isinstance(missing, dict)
        for key, label in _FIELDS:
            if key == "missing":
                shown = "; ".join(f"{signal} ({why})" for signal, why in missing.items()) or "-"
            elif key == "kv_usage" and view[key] is None and KV_USAGE_SIGNAL in missing:
                shown = "unknown (" + missing[KV_USAGE_SIGNAL] + ")"  # never a number nobody measured
            else:
                shown = _show(view[key])
            print(f"{label:<{width}}  {shown}")
    return 0 if view["generation"] is not None else 1
