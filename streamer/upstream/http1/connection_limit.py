"""`--upstream-max-connections`: one bound on the connections in use to a backend origin.

Shared by every pool to that origin (pools may be per client), so the bound holds across
the gateway. A connection holds a slot from the moment it is taken for a request until
it goes back idle or is lost; a request beyond the limit waits, first come first served,
for a slot (its client going away cancels the wait). Idle pooled connections hold none:
they are never more than the most ever in use at once.
"""

from __future__ import annotations

import asyncio


class ConnectionLimit:
    """A semaphore that says how many hold it and how many wait (for tests and metrics)."""

    __slots__ = ("_semaphore", "in_use", "limit", "waiting")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a connection limit is at least 1")
        self.limit = limit
        self._semaphore = asyncio.Semaphore(limit)
        self.in_use = 0
        self.waiting = 0

    async def acquire(self) -> None:
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self._semaphore.release()
