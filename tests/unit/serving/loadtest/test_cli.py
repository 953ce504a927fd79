"""`inferwatch loadtest`, `inferwatch warmup --to-rps` and `inferwatch drill kill`: options, output, exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from exporters.records import Outcome, RequestRecord
from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.records import event_from_record
from serving import cli
from tests.fakes.openai_upstream import FakeOpenAI

Servers = Callable[..., Awaitable[TestServer]]
Main = Callable[[list[str]], int]


@pytest.fixture(name="cli_main")
def _cli_main() -> Main:
    assert {"load", "drill"} <= set(cli.COMMAND_MODULES), "loadtest, warmup and drill are registered"
    return cli.main


async def _url(aiohttp_server: Servers, fake: FakeOpenAI) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


class TestLoadtest:
    """Steps, reports and replays from the command line."""

    async def test_steps_print_one_object_per_step(
        self, aiohttp_server: Servers, cli_main: Main, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--concurrency 1,3 runs two steps of --requests each; --json lists them with their labels."""
        fake = FakeOpenAI(model_name="m")
        url = await _url(aiohttp_server, fake)
        code = await asyncio.to_thread(cli_main, ["loadtest", "--url", url, "--model", "m", "--concurrency", "1,3",
                                                  "--requests", "4", "--max-tokens", "2", "--json", "--quiet"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        assert [s["label"] for s in out["steps"]] == ["concurrency 1", "concurrency 3"]
        assert [s["requests"]["sent"] for s in out["steps"]] == [4, 4]
        assert len(fake.requests) == 8

    async def test_report_directory_from_the_command_line(
        self, aiohttp_server: Servers, cli_main: Main, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--report writes the files and prints where; the SLO flags reach report.json."""
        url = await _url(aiohttp_server, FakeOpenAI(model_name="m", count_prompt_words=True, max_model_len=512))
        code = await asyncio.to_thread(cli_main, [
            "loadtest", "--url", url, "--model", "m", "--mix", "8:1,32:1", "--requests", "6", "--max-tokens", "2",
            "--report", str(tmp_path / "r"), "--metrics-url", "none", "--slo-latency-s", "2.5",
            "--slo-objective", "0.9", "--expected-rpm", "100"])
        err = capsys.readouterr().err
        assert code == 0, err
        document = json.loads((tmp_path / "r/report.json").read_text())
        assert document["slo"] == {"latency_s": 2.5, "objective": 0.9}
        assert document["timeline"] is None
        assert document["options"]["mix"] == "8:1,32:1"
        assert (tmp_path / "r/report.md").exists()
        assert "report written" in err
        assert "calibrated 32 tokens" in err

    async def test_replay_sends_the_archived_requests(
        self, aiohttp_server: Servers, cli_main: Main, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each archived generation request is sent once, at its prompt and output lengths, 20 times faster."""
        writer = ArchiveWriter(LogConfig(dir=str(tmp_path)))
        for n in range(5):
            writer.append(event_from_record(RequestRecord(
                trace_id=f"{n + 1:032x}", span_id="0" * 16, route="/v1/completions", model="served", stream=True,
                http_status=200, outcome=Outcome.OK, prompt_tokens=10 + 10 * n, completion_tokens=3 + n,
                e2e_s=0.5, start_unix=1_700_000_000.0 + n), sla_s=None))
        writer.close()
        fake = FakeOpenAI(model_name="served", count_prompt_words=True)
        url = await _url(aiohttp_server, fake)
        code = await asyncio.to_thread(cli_main, ["loadtest", "--url", url, "--replay", str(tmp_path),
                                                  "--replay-speed", "20", "--json", "--quiet"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        assert out["requests"]["sent"] == 5
        sent = sorted((r["body"]["max_tokens"], r["body"]["model"]) for r in fake.requests)
        assert sent == [(3 + n, "served") for n in range(5)]
        assert out["tokens"]["prompt"] == sum(10 + 10 * n for n in range(5))

    @pytest.mark.parametrize(("argv", "option"), [
        pytest.param(["--mix", "8:1", "--prompts", "x.jsonl"], "--prompts", id="a mix and a prompts file"),
        pytest.param(["--cold-starts", "1", "--duration", "5"], "--restart-cmd", id="cold starts without a command"),
        pytest.param(["--cold-starts", "1", "--restart-cmd", "true"], "--cold-starts",
                     id="cold starts without a step duration"),
        pytest.param(["--preset", "long-context", "--concurrency", "2"], "--preset", id="a preset with a pace"),
        pytest.param(["--concurrency", "2", "--arrivals", "poisson", "--mix", "0:1"], "--mix", id="a bad mix"),
        pytest.param(["--rate", "0,2"], "--rate", id="a zero rate among the steps"),
    ])
    def test_bad_combinations_exit_2(
        self, argv: list[str], option: str, cli_main: Main, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Usage errors exit 2 and name the option, before any request is sent."""
        assert cli_main(["loadtest", "--url", "http://127.0.0.1:1", "--model", "m", "--quiet", *argv]) == 2
        assert option in capsys.readouterr().err


class TestWarmupRamp:
    """`inferwatch warmup --to-rps`."""

    async def test_ramp_exit_codes(
        self, aiohttp_server: Servers, cli_main: Main, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A healthy fast upstream meets the SLO at the target rate (exit 0); a failing one does not (exit 1)."""
        url = await _url(aiohttp_server, FakeOpenAI(model_name="m"))
        ramp = ["--from-rps", "5", "--to-rps", "15", "--over", "0.5", "--hold", "0.5", "--window-s", "0.25",
                "--slo-latency-s", "1", "--slo-objective", "0.9"]
        ok = await asyncio.to_thread(cli_main, ["warmup", "--url", url, "--model", "m", *ramp])
        assert ok == 0
        assert "met" in capsys.readouterr().out
        failed = await asyncio.to_thread(cli_main, ["warmup", "--url", url, "--model", "fail", *ramp, "--json"])
        assert failed == 1
        result = json.loads(capsys.readouterr().out)
        assert result["at_target"]["meets_slo"] is False
        assert result["failed"] == result["sent"] > 0


class TestDrillOptions:
    """`inferwatch drill kill` refuses what it cannot act on."""

    @pytest.mark.parametrize(("argv", "option"), [
        pytest.param(["--pid", "999999999"], "--pid", id="a pid that does not exist"),
        pytest.param(["--match", "("], "--match", id="a pattern that is not a regular expression"),
        pytest.param(["--match", "no process has this command line 0xdeadbeef"], "--match",
                     id="a pattern matching nothing"),
    ])
    def test_bad_targets_exit_2(
        self, argv: list[str], option: str, cli_main: Main, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Nothing is killed when the process cannot be found exactly."""
        code = cli_main(["drill", "kill", *argv, "--restart-cmd", "true", "--url", "http://127.0.0.1:1",
                         "--model", "m"])
        assert code == 2
        assert option in capsys.readouterr().err
