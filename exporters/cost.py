"""Cost pools and prices: section ``[cost]``, and the pure functions that put a request in a pool and price it.

Three pools: ``special`` (a route in ``cost.special_routes`` or a request class, the header
``cost.request_class_header``, in ``cost.special_classes``: code generation, say), else
``long_context`` (a prompt of at least ``cost.long_context_tokens`` tokens), else ``base``.
A request's cost is its GPU-seconds at the model's price per GPU-hour plus its tokens at the
model's price per million tokens, times its pool's price factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporters.configuring import positive, setting

BASE, LONG_CONTEXT, SPECIAL = "base", "long_context", "special"
POOLS = (BASE, LONG_CONTEXT, SPECIAL)
ANY_MODEL = "*"
"""The price key that applies to every model without its own price."""


def _prices(value: Any) -> str | None:
    return None if all(price >= 0 for price in value.values()) else "prices must be 0 or greater"


def _pool_factors(value: Any) -> str | None:
    unknown = sorted(set(value) - set(POOLS))
    if unknown:
        return f"has the unknown pool {unknown[0]!r}; pools: {', '.join(POOLS)}"
    return _prices(value)


@dataclass(frozen=True, slots=True)
class CostConfig:
    """Section ``[cost]``: cost pools, prices and the answer-cache estimate."""

    long_context_tokens: int = setting(
        8192, "Prompt tokens from which a request is in the long_context cost pool.", check=positive
    )
    special_routes: list[str] = setting(
        [], "Routes whose requests are in the special cost pool, e.g. [\"/v1/completions\"].",
    )
    request_class_header: str = setting(
        "x-request-class", "Request header naming a request's class; a class in special_classes puts it in the "
        "special cost pool.",
    )
    special_classes: list[str] = setting(
        ["code"], "Request classes (request_class_header values) of the special cost pool.",
    )
    gpu_hour_prices: dict[str, float] = setting(
        {}, "Price of one GPU-hour by model name (\"*\": every other model), e.g. {\"*\" = 2.5}.", check=_prices,
    )
    million_token_prices: dict[str, float] = setting(
        {}, "Price of one million tokens (prompt plus completion) by model name (\"*\": every other model), added "
        "to the GPU-hour price.", check=_prices,
    )
    pool_price_factors: dict[str, float] = setting(
        {BASE: 1.0, LONG_CONTEXT: 1.0, SPECIAL: 1.0}, "Factor on the price of each cost pool (a long-context "
        "surcharge: {long_context = 1.25}); a pool not named keeps 1.", check=_pool_factors,
    )
    currency: str = setting("USD", "Currency the prices are in (shown in showback reports).")
    estimate_prefill_tokens_per_s: float = setting(
        5000.0, "Without the stat-logger plugin: prompt tokens one GPU prefills per second, for the token-based "
        "GPU-seconds estimate (basis=\"token_estimate\").", check=positive,
    )
    estimate_decode_tokens_per_s: float = setting(
        50.0, "Without the stat-logger plugin: completion tokens one request decodes per GPU-second, for the "
        "token-based GPU-seconds estimate.", check=positive,
    )
    repeat_ttl_s: float = setting(
        900.0, "TTL of the answer cache whose savings are estimated: a prompt answered within it is a repeat.",
        check=positive,
    )
    repeat_max_entries: int = setting(
        100_000, "Prompts remembered for the repeat estimate (salted 64-bit hashes; past it the oldest are "
        "forgotten early and counted).", check=positive,
    )


def cost_pool(config: CostConfig, route: str, request_class: str | None, prompt_tokens: int | None) -> str:
    """The request's cost pool: special by route or class, else long_context by prompt length, else base."""
    if route in config.special_routes or (request_class is not None and request_class in config.special_classes):
        return SPECIAL
    if prompt_tokens is not None and prompt_tokens >= config.long_context_tokens:
        return LONG_CONTEXT
    return BASE


def _price(prices: dict[str, float], model: str) -> float:
    return prices.get(model, prices.get(ANY_MODEL, 0.0))


Rates = tuple[float, float, float]
"""A model's price in a pool: per GPU-second, per token, and the pool's factor."""


def price_rates(config: CostConfig, model: str, pool: str) -> Rates:
    """The rates :func:`cost_at` applies to ``model`` in ``pool`` (the same for every request of that pair)."""
    return (_price(config.gpu_hour_prices, model) / 3600.0, _price(config.million_token_prices, model) / 1e6,
            config.pool_price_factors.get(pool, 1.0))


def cost_at(rates: Rates, gpu_seconds: float, tokens: int) -> float:
    """Cost of GPU-seconds and tokens at ``rates``."""
    per_gpu_second, per_token, factor = rates
    return (gpu_seconds * per_gpu_second + tokens * per_token) * factor


def request_cost(config: CostConfig, model: str, pool: str, gpu_seconds: float, tokens: int) -> float:
    """Cost of GPU-seconds and tokens of ``model`` in ``pool``."""
    return cost_at(price_rates(config, model, pool), gpu_seconds, tokens)
