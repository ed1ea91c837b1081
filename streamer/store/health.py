"""Whether the store takes writes, as this process last found out: the rule that refuses a
`store: true` turn before its first byte while the store is known to be down.

Every write the gateway makes at a turn's end says how it went (`wrote`); the readiness
probe says so too. While the last word was a failure, a new `store: true` turn asks again
(one probe write, shared, at most once per `retry_seconds`) and is refused 503 if the store
still fails: the client learns at once, not after a whole answer that was then not kept.
While the store is fine this costs a comparison per turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from streamer.store.base import ResponseStore


class StoreHealth:
    """The store's write health, from real writes and probe writes."""

    __slots__ = ("_checked", "_clock", "_probe", "down", "retry_seconds", "store")

    def __init__(
        self,
        store: ResponseStore,
        retry_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.retry_seconds = retry_seconds
        self.down = False  # the last write or probe failed
        self._checked = 0.0
        self._clock = clock
        self._probe: asyncio.Task[bool] | None = None

    def wrote(self, ok: bool) -> None:
        """A write (a record at a turn's end, a probe) succeeded or failed."""
        self.down = not ok
        self._checked = self._clock()

    async def writable(self) -> bool:
        """True unless the store is known to be down and a probe now confirms it."""
        if not self.down:
            return True
        if self._clock() - self._checked < self.retry_seconds:
            return False
        return await self.probe()

    async def probe(self) -> bool:
        """One probe write (concurrent callers share it); its answer is remembered."""
        if self._probe is None:
            self._probe = asyncio.ensure_future(self._write())
        # shielded: a caller that goes away does not cancel the others' probe
        return await asyncio.shield(self._probe)

    async def _write(self) -> bool:
        try:
            try:
                ok = await self.store.ping()
            except Exception:
                ok = False
            self.wrote(ok)
            return ok
        finally:
            self._probe = None
