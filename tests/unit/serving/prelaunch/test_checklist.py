"""The checklist's items, report and exit code; the baseline's regressions; the jitter proxy's delays."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from serving.prelaunch import baseline, checklist
from serving.prelaunch.checklist import Item
from serving.prelaunch.items import PrelaunchSpec
from serving.prelaunch.jitter import JitterProxy


def _items() -> list[Item]:
    return [Item("mix", "A 512/8k/32k mix at 7:2:1", "pass", "6 requests, 0 failed.", {"requests": 6},
                 ("ab" * 16,)),
            Item("capacity", "Capacity for the expected load", "manual", "Give --expected-rpm N."),
            Item("long_lane", "Prompts over 4,096 tokens have their own queue", "fail", "No long lane.",
                 {"requests_by_lane": {"default": 6.0}})]


def test_the_exit_code_is_1_only_when_a_line_fails() -> None:
    """Manual lines do not fail the run; one failed line does."""
    items = _items()
    assert checklist.exit_code(items) == 1
    assert checklist.exit_code([i for i in items if i.verdict != "fail"]) == 0


def test_an_unknown_verdict_is_refused() -> None:
    """Only pass, fail and manual exist."""
    with pytest.raises(ValueError, match="maybe"):
        Item("x", "X", "maybe", "?")


def test_the_report_files_hold_every_line_with_its_evidence(tmp_path: Path) -> None:
    """checklist.json round-trips the items; checklist.md has the summary table, each line's numbers and ids."""
    doc = checklist.document(_items(), url="http://x:9100", model="m", started_unix=1.0, wall_s=2.0,
                             warnings=["capped"])
    json_path, md_path = checklist.write(tmp_path / "r", doc)
    assert json.loads(json_path.read_text())["counts"] == {"pass": 1, "fail": 1, "manual": 1}
    text = md_path.read_text()
    assert "| 3 | Prompts over 4,096 tokens have their own queue | **fail** | No long lane. |" in text
    assert "- requests_by_lane: default=6" in text
    assert "ab" * 16 in text
    assert "- warning: capped" in text


@pytest.mark.parametrize(("now", "expected"), [
    ({"e2e_p99_s": 1.09, "requests_per_s": 9.1}, []),
    ({"e2e_p99_s": 1.2, "requests_per_s": 10.0}, ["e2e_p99_s"]),
    ({"e2e_p99_s": 1.0, "requests_per_s": 8.0}, ["requests_per_s"]),
], ids=["within both limits", "p99 up 20 %", "throughput down 20 %"])
def test_regressions_beyond_the_limits(now: dict[str, float], expected: list[str]) -> None:
    """p99 may rise 10 % and throughput drop 10 % against the baseline; beyond either is a regression."""
    found = baseline.regressions({"e2e_p99_s": 1.0, "requests_per_s": 10.0}, now, baseline.Limits())
    assert [f.split()[0] for f in found] == expected


GPU_BASELINE = {"power_watts": 700.0, "tokens_per_joule": 2.0, "temperature_celsius_max": 60.0}


@pytest.mark.parametrize(("now", "expected"), [
    ({"power_watts": 770.0, "tokens_per_joule": 1.8, "temperature_celsius_max": 65.0}, []),
    ({"power_watts": 771.0, "tokens_per_joule": 2.0, "temperature_celsius_max": 60.0}, ["power_watts"]),
    ({"power_watts": 700.0, "tokens_per_joule": 1.79, "temperature_celsius_max": 60.0}, ["tokens_per_joule"]),
    ({"power_watts": 700.0, "tokens_per_joule": 2.0, "temperature_celsius_max": 65.5},
     ["temperature_celsius_max"]),
], ids=["at every limit", "power up 10.1 %", "tokens per joule down 10.5 %", "5.5 degrees warmer"])
def test_gpu_regressions_beyond_the_limits(now: dict[str, float], expected: list[str]) -> None:
    """Power may rise 10 %, tokens per joule drop 10 % and the hottest GPU warm by 5 degrees (not a share of a
    Celsius reading); beyond any is a regression."""
    found = baseline.regressions(GPU_BASELINE, now, baseline.Limits())
    assert [f.split()[0] for f in found] == expected


def test_a_figure_missing_on_either_side_is_not_compared() -> None:
    """No power now (no NVML) or none in the baseline: nothing flagged for it, and it is listed as not compared."""
    now = {"power_watts": None, "tokens_per_joule": None, "temperature_celsius_max": 90.0}
    assert baseline.regressions({**GPU_BASELINE, "temperature_celsius_max": None}, now, baseline.Limits()) == []
    assert baseline.uncompared(GPU_BASELINE, now) == ["e2e_p99_s", "ttft_p99_s", "power_watts", "requests_per_s",
                                                      "output_tokens_per_s", "tokens_per_joule"]


async def test_the_jitter_proxy_delays_each_request_within_its_bounds() -> None:
    """Every request through the proxy draws a delay in [min, max] and gets the target's answer."""
    app = web.Application()
    async def answer(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    target = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with JitterProxy(target, 0.05, 0.15) as proxy, aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(proxy.url + "/v1/completions", json={}) as reply:
                    assert await reply.json() == {"ok": True}
        assert len(proxy.delays_s) == 3
        assert all(0.05 <= d <= 0.15 for d in proxy.delays_s)
    finally:
        await runner.cleanup()


def test_each_lines_load_has_a_seed_of_its_own() -> None:
    """Every line's load gets its own seed, so no line repeats another's requests (a fast retry of its own)."""
    spec = PrelaunchSpec(url="http://127.0.0.1:1", model="m")
    seeds = [spec.load().seed for _ in range(5)]
    assert len(set(seeds)) == 5
    assert 0 not in seeds
