"""From the options of ``inferwatch loadtest`` to a :class:`~serving.loadtest.steps.RunPlan`.

Checks the combination of options (every problem a ConfigError naming the option), builds one
spec per step, reads the prompts file or the archive to replay, and calibrates generated
prompt lengths against the target (which is why this is a coroutine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import aiohttp

from exporters.errors import ConfigError
from serving.loadtest import calibrate as cal
from serving.loadtest.coldstart import Probe, Restart
from serving.loadtest.errors import LoadTestError
from serving.loadtest.prompts import (
    GeneratedSource,
    Length,
    ReplaySource,
    Source,
    load_prompts,
    parse_mix,
    replay_records,
)
from serving.loadtest.run import default_source
from serving.loadtest.spec import MAX_DURATION_S, LoadSpec, base_url, check_range, endpoint
from serving.loadtest.steps import LONG_CONTEXT_STEP, ColdStartPlan, RunPlan

PRESETS = ("long-context",)
LONG_CONTEXT_REQUESTS = 100


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """The options of one load test, as given (before any default for a missing pace or bound)."""

    base: LoadSpec
    concurrency: tuple[int, ...] = ()
    rate: tuple[float, ...] = ()
    mix: str | None = None
    prompts: str | None = None
    replay: str | None = None
    replay_speed: float = 1.0
    preset: str | None = None
    metrics_url: str | None = None
    scrape_interval_s: float = 1.0
    cold_starts: int = 0
    restart: Restart | None = None
    health_path: str = "/health"
    ready_deadline_s: float = 600.0
    shock_window_s: float = 60.0


def step_specs(options: LoadOptions) -> tuple[tuple[LoadSpec, ...], tuple[str, ...]]:
    """One validated spec per step, with its label."""
    base = options.base
    if options.concurrency and options.rate:
        raise ConfigError("--rate", "give either concurrencies or rates, not both")
    if options.concurrency:
        specs = [replace(base, concurrency=c, rate=None) for c in options.concurrency]
    elif options.rate:
        specs = [replace(base, rate=r, concurrency=None) for r in options.rate]
    else:
        specs = [base]
    if len(specs) > 1 and base.requests is None and base.duration_s is None:
        raise ConfigError("--step-duration", "several steps need a bound per step: --step-duration S or --requests N")
    validated = tuple(s.validate() for s in specs)
    return validated, tuple(s.pace for s in validated)


def _check_combination(options: LoadOptions) -> None:
    chosen = [name for name, value in (("--mix", options.mix), ("--prompts", options.prompts),
                                       ("--replay", options.replay), ("--preset", options.preset)) if value]
    if len(chosen) > 1:
        raise ConfigError(chosen[1], f"give one of --mix, --prompts, --replay and --preset, not {' and '.join(chosen)}")
    if options.preset is not None and options.preset not in PRESETS:
        raise ConfigError("--preset", f"must be one of {', '.join(PRESETS)}", options.preset)
    if (options.preset or options.replay) and (options.concurrency or options.rate):
        raise ConfigError("--preset" if options.preset else "--replay",
                          "sets its own pace: do not combine it with --concurrency or --rate")
    check_range("--replay-speed", options.replay_speed, 0.0, 1000.0, open_low=True)
    check_range("--scrape-interval", options.scrape_interval_s, 0.0, 3600.0, open_low=True)
    check_range("--cold-starts", options.cold_starts, 0, 100)
    check_range("--shock-window", options.shock_window_s, 0.0, MAX_DURATION_S, open_low=True)
    if options.cold_starts and options.restart is None:
        raise ConfigError("--restart-cmd", "--cold-starts needs the command that restarts the upstream")
    if not options.health_path.startswith("/"):
        raise ConfigError("--health-path", "must start with /", options.health_path)


async def prepare(options: LoadOptions, *, say: Callable[[str], None]) -> tuple[RunPlan, cal.Calibration | None]:
    """The plan of the load test (and what calibration found), after checking every option."""
    _check_combination(options)
    base = options.base
    calibration = None
    offsets: Sequence[float] | None = None
    if options.preset == "long-context":
        requests = base.requests or LONG_CONTEXT_REQUESTS
        specs: tuple[LoadSpec, ...] = (
            replace(base, requests=requests, duration_s=None, concurrency=1, rate=None).validate(),)
        labels: tuple[str, ...] = (LONG_CONTEXT_STEP,)
    elif options.replay:
        specs, labels = (), ()
    else:
        specs, labels = step_specs(options)
    source: Source
    if options.prompts:
        source = load_prompts(options.prompts, max_tokens=base.max_tokens)
    elif options.replay:
        source, specs, offsets, calibration = await _replay(options, say)
        labels = ("replay",)
    elif options.mix or options.preset:
        source, calibration = await _generated(options, say)
    else:
        source = default_source(base)
    if options.cold_starts and any(s.duration_s is None for s in specs):
        raise ConfigError("--cold-starts", "cold starts are spread over the run's duration: bound every step by "
                          "--step-duration")
    cold = None
    if options.cold_starts and options.restart is not None:
        probe = Probe(base_url(base.url) + options.health_path, endpoint(base.url, chat=base.chat), base.model,
                      ready_deadline_s=options.ready_deadline_s)
        cold = ColdStartPlan(options.cold_starts, options.restart, probe, options.shock_window_s)
    plan = RunPlan(specs, labels, source, offsets, options.metrics_url, options.scrape_interval_s, cold)
    return plan, calibration


async def _calibrated(
    options: LoadOptions, targets: Sequence[int], say: Callable[[str], None], *, chat: bool
) -> cal.Calibration:
    base = options.base
    async with aiohttp.ClientSession() as session:
        return await cal.calibrate(session, base.url, base.model, targets, chat=chat, max_tokens=base.max_tokens,
                                   say=say)


async def _generated(options: LoadOptions, say: Callable[[str], None]) -> tuple[GeneratedSource, cal.Calibration]:
    base = options.base
    if options.preset == "long-context":
        async with aiohttp.ClientSession() as session:
            context = await cal.max_model_len(session, base.url, base.model)
        if context is None:
            raise LoadTestError(base.url, f"GET /v1/models gives no max_model_len for {base.model!r}: the "
                                "long-context preset needs the model's context length")
        entries: tuple[tuple[int, float], ...] = ((context - base.max_tokens, 1.0),)
    else:
        entries = parse_mix(options.mix or "")
    calibration = await _calibrated(options, [tokens for tokens, _ in entries], say, chat=base.chat)
    lengths = calibration.lengths
    if options.preset:
        lengths = [replace(lengths[0], label="max-context")]
    source = GeneratedSource(tuple(lengths), tuple(w for _, w in entries), base.max_tokens, base.chat, base.seed,
                             name=options.preset or "mix")
    return source, calibration


async def _replay(
    options: LoadOptions, say: Callable[[str], None]
) -> tuple[ReplaySource, tuple[LoadSpec, ...], list[float], cal.Calibration]:
    base = options.base
    assert options.replay is not None
    records, skipped = replay_records(options.replay, default_max_tokens=base.max_tokens)
    if not records:
        raise ConfigError("--replay", f"the archive holds no generation request with a prompt length "
                          f"({skipped} records skipped)", options.replay)
    if base.model:
        records = [replace(r, model=base.model) for r in records]
    distinct = sorted({r.prompt_tokens for r in records})
    say(f"replaying {len(records)} archived requests ({skipped} records skipped); calibrating {len(distinct)} "
        "prompt lengths")
    model = base.model or records[0].model
    async with aiohttp.ClientSession() as session:
        calibration = await cal.calibrate(session, base.url, model, distinct, chat=False, max_tokens=1, say=say)
    words: dict[int, Length] = dict(zip(distinct, calibration.lengths, strict=True))
    offsets = [r.offset_s / options.replay_speed for r in records]
    span = max(offsets[-1], 1e-3)
    spec = replace(base, model=model, requests=len(records), duration_s=None, concurrency=None,
                   rate=len(records) / span, arrivals="scheduled").validate()
    return ReplaySource(options.replay, tuple(records), words, skipped), (spec,), offsets, calibration
