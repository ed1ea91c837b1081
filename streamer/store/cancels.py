"""Cancel requests within one process (the memory and SQLite stores): a flag per response
that a waiter may see before or after it is set, bounded by count and by a TTL."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Cancel:
    expires: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


class Cancels:
    """`request`/`wait` of `ResponseStore.request_cancel`/`wait_cancel`, in memory. At most
    `limit` flags are kept (oldest asked first out, never one with a waiter)."""

    def __init__(self, limit: int, ttl_seconds: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._cancels: OrderedDict[str, _Cancel] = OrderedDict()

    def request(self, response_id: str) -> None:
        cancel = self._cancel(response_id)
        cancel.expires = self._clock() + self.ttl_seconds
        self._cancels.move_to_end(response_id)
        cancel.event.set()
        self._trim()

    async def wait(self, response_id: str) -> None:
        cancel = self._cancel(response_id)
        cancel.waiters += 1
        try:
            await cancel.event.wait()
        finally:
            cancel.waiters -= 1
            unused = cancel.waiters == 0 and not cancel.event.is_set()
            if unused and self._cancels.get(response_id) is cancel:
                del self._cancels[response_id]

    def forget(self, response_id: str) -> None:
        """A deleted response's flag goes with it (unless someone waits on it)."""
        cancel = self._cancels.get(response_id)
        if cancel is not None and cancel.waiters == 0:
            del self._cancels[response_id]

    def _cancel(self, response_id: str) -> _Cancel:
        cancel = self._cancels.get(response_id)
        if cancel is None:
            cancel = self._cancels[response_id] = _Cancel(self._clock() + self.ttl_seconds)
        return cancel

    def _trim(self) -> None:
        now = self._clock()
        for response_id, cancel in list(self._cancels.items()):
            stale = cancel.expires <= now or len(self._cancels) > self.limit
            if not stale:
                break
            if cancel.waiters == 0:
                del self._cancels[response_id]
