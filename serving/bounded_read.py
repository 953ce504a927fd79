"""Read an aiohttp client answer's body to its end, but no further than a limit.

``StreamReader.read(n)`` is not that: it returns as soon as any bytes are buffered, so an answer
that arrives in pieces comes back cut short.
"""

from __future__ import annotations

import aiohttp


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body to its end when it is ``limit`` bytes or fewer; past that, more than ``limit`` bytes (stops
    reading as soon as the limit is passed), so ``len(result) > limit`` tells an answer that is too large."""
    body = bytearray()
    async for piece in content.iter_any():
        body += piece
        if len(body) > limit:
            break
    return bytes(body)
