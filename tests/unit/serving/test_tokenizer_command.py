"""`inferwatch tokenizer diff` against fake upstreams: the verdict, the exit codes, precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from serving.cli import main
from tests.fakes.faulty_upstream import ThreadedServer


def _tokenizer(shift: int) -> web.Application:
    """A /tokenize whose ids are the text's characters (plus ``shift`` for the letter 'a')."""

    async def tokenize(request: web.Request) -> web.Response:
        text = (await request.json())["prompt"]
        return web.json_response({"tokens": [ord(c) + (shift if c == "a" else 0) for c in text]})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    return app


def test_the_verdict_follows_max_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """'abcd' differs in one id of four (0.25), 'xyz' in none: the score is their mean, 0.125; the worst text is
    listed, 'xyz' not; above --max-score the exit is 1, at or under it 0."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcd\n\nxyz\n", encoding="utf-8")
    with ThreadedServer(lambda: _tokenizer(0)) as a, ThreadedServer(lambda: _tokenizer(1)) as b:
        argv = ["tokenizer", "diff", "--a", a.url, "--b", b.url, "--model", "m", "--corpus", str(corpus)]
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert "score 0.1250" in out
        assert "FAIL" in out
        assert '0.2500  4 vs 4 tokens  "abcd"' in out
        assert '"xyz"' not in out  # a text both split the same way is not among the worst
        assert main([*argv, "--max-score", "0.125"]) == 0


def test_an_unreachable_upstream_or_an_empty_corpus_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The message names the upstream and the text, or the corpus file."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with ThreadedServer(lambda: _tokenizer(0)) as a:
        assert main(["tokenizer", "diff", "--a", a.url, "--b", "http://127.0.0.1:9", "--model", "m"]) == 2
        assert "http://127.0.0.1:9 could not tokenize text 1 for model 'm'" in capsys.readouterr().err
        assert main(["tokenizer", "diff", "--a", a.url, "--b", a.url, "--model", "m", "--corpus", str(empty)]) == 2
        assert "holds no text" in capsys.readouterr().err
