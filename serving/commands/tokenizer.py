"""`inferwatch tokenizer diff --a URL --b URL --model M`: how differently two upstreams tokenize the same texts."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from exporters.tokenizer_drift import PROBE_TEXTS, DiffReport, compare
from serving.cutover import tokenize

DEFAULT_MAX_SCORE = 0.01
WORST = 5
HELP = """Tokenize the same texts with two upstreams' /tokenize (vLLM's, no special tokens) and compare the
token ids. A text's diff-score is the edit distance between the two id sequences (one token inserted,
deleted or replaced counts 1) over the longer sequence's length: 0 when the ids are the same, 1 when they
share nothing. The summary score is the mean over the texts. Texts: --corpus (UTF-8, one text per line,
empty lines skipped), else the sidecar's fingerprint probe set (emoji, CJK, code, whitespace runs, long
numbers). Exit 0 when the score is at most --max-score, 1 above it, 2 when an upstream cannot be asked."""


class UpstreamProblemError(Exception):
    """An upstream could not tokenize a text; the message says which and why."""


def register(subparsers: Any) -> None:
    """Add ``tokenizer diff``."""
    group = subparsers.add_parser("tokenizer", help="compare upstreams' tokenizers")
    commands = group.add_subparsers(dest="tokenizer_command", metavar="COMMAND", required=True)
    diff = commands.add_parser("diff", help="diff-score of two upstreams' tokenizers over texts",
                               description=HELP)
    diff.add_argument("--a", required=True, metavar="URL", help="base URL of the first vLLM (e.g. the old one)")
    diff.add_argument("--b", required=True, metavar="URL", help="base URL of the second vLLM (e.g. the new one)")
    diff.add_argument("--model", required=True, help="model name to tokenize with, on both")
    diff.add_argument("--corpus", type=Path, metavar="FILE", help="texts to compare, one per line")
    diff.add_argument("--max-score", type=float, default=DEFAULT_MAX_SCORE, metavar="SCORE",
                      help=f"highest summary score that passes (default {DEFAULT_MAX_SCORE})")
    diff.add_argument("--worst", type=int, default=WORST, metavar="N", help=f"worst texts shown (default {WORST})")
    diff.add_argument("--json", action="store_true", help="print the report as JSON")
    diff.set_defaults(func=run_diff)


def read_corpus(path: Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file.

    Raises:
        OSError, UnicodeDecodeError: it cannot be read.
    """
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


async def _ids(session: aiohttp.ClientSession, url: str, model: str, texts: list[str]) -> list[list[int]]:
    out = []
    for n, text in enumerate(texts, 1):
        try:
            out.append(await tokenize(session, url, model, text))
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise UpstreamProblemError(f"{url} could not tokenize text {n} for model {model!r}: {err}") from err
        if n % 100 == 0:
            print(f"{url}: {n}/{len(texts)} texts tokenized", file=sys.stderr)
    return out


async def diff_upstreams(a: str, b: str, model: str, texts: list[str]) -> DiffReport:
    """Tokenize ``texts`` on both upstreams (at the same time) and compare.

    Raises:
        UpstreamProblemError: an upstream did not give the ids of a text.
    """
    async with aiohttp.ClientSession() as session:
        ids_a, ids_b = await asyncio.gather(_ids(session, a, model, texts), _ids(session, b, model, texts))
    return compare(texts, ids_a, ids_b)


def report_json(report: DiffReport, args: argparse.Namespace, source: str) -> dict[str, Any]:
    """The JSON report: summary, verdict, the worst texts and every text's score."""

    def row(diff: Any) -> dict[str, Any]:
        return {"text": diff.text, "score": diff.score, "tokens_a": diff.tokens_a, "tokens_b": diff.tokens_b}

    return {
        "a": args.a, "b": args.b, "model": args.model, "texts_from": source, "texts": len(report.texts),
        "score": report.score, "worst_score": report.max_score, "differing_texts": report.differing,
        "max_score": args.max_score, "passed": report.score <= args.max_score,
        "worst": [row(d) for d in report.worst(args.worst)], "per_text": [row(d) for d in report.texts],
    }


def _print_text(report: DiffReport, args: argparse.Namespace, source: str) -> None:
    verdict = "pass" if report.score <= args.max_score else "FAIL"
    print(f"tokenizer diff of model {args.model!r}: a={args.a} b={args.b}, {len(report.texts)} texts ({source})")
    print(f"score {report.score:.4f} (mean diff-score; worst {report.max_score:.4f}; {report.differing} of "
          f"{len(report.texts)} texts differ), max {args.max_score:g}: {verdict}")
    worst = [d for d in report.worst(args.worst) if d.score > 0]
    if worst:
        print("worst texts:")
    for diff in worst:
        text = diff.text if len(diff.text) <= 70 else diff.text[:69] + "…"
        print(f"  {diff.score:.4f}  {diff.tokens_a} vs {diff.tokens_b} tokens  {json.dumps(text, ensure_ascii=False)}")


def run_diff(args: argparse.Namespace) -> int:
    """``inferwatch tokenizer diff``: 0 at most --max-score, 1 above, 2 on a bad corpus or upstream."""
    if args.corpus is not None:
        try:
            texts, source = read_corpus(args.corpus), str(args.corpus)
        except (OSError, UnicodeDecodeError) as err:
            print(f"inferwatch tokenizer diff: cannot read --corpus {args.corpus}: {err}", file=sys.stderr)
            return 2
        if not texts:
            print(f"inferwatch tokenizer diff: --corpus {args.corpus} holds no text", file=sys.stderr)
            return 2
    else:
        texts, source = list(PROBE_TEXTS), "the fingerprint probe set"
    try:
        report = asyncio.run(diff_upstreams(args.a, args.b, args.model, texts))
    except UpstreamProblemError as err:
        print(f"inferwatch tokenizer diff: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_json(report, args, source), ensure_ascii=False, indent=2))
    else:
        _print_text(report, args, source)
    return 0 if report.score <= args.max_score else 1


__all__ = ["diff_upstreams", "read_corpus", "register", "report_json", "run_diff"]
