"""Bounds on backend connections: those in use to one origin, and those open in all.

`ConnectionLimit`, `--upstream-max-connections`: one bound on the connections in use to a
backend origin.

Shared by every pool to that origin (pools may be per client), so the bound holds across
the gateway. A connection holds a slot from the moment it is taken for a request until
it goes back idle or is lost; a request beyond the limit waits, first come first served,
for a slot (its client going away cancels the wait). Idle pooled connections hold none:
they are never more than the most ever in use at once.

`OpenConnections`, `--upstream-max-open-connections`: every backend connection this
process has open, idle ones included, under one cap, so that backend connections never
take the descriptors that clients need (see its docstring).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol


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


class Closable(Protocol):
    """What the open-connection cap needs of a connection: to cut it."""

    def abort(self) -> None: ...


class OpenConnections:
    """`--upstream-max-open-connections`: the backend connections this process has open,
    in use or idle, every backend and pool together, under one cap (its share of the
    open-file budget, `streamer.fd_budget`).

    A pool asks `reserve()` before it connects and says what each connection does since:
    `opened`, `idle` (kept alive for reuse), `busy` (taken again), `closed` (or a connect
    that failed: `unreserve`). At the cap, a new connection first closes the one idle
    longest, in whichever pool (an idle connection is only a saving, a reconnect); with
    none idle it waits, first come first served, for one to close (its caller going
    away cancels the wait). A connection going idle while others wait is closed at once
    instead: its descriptor is theirs.
    """

    __slots__ = ("_counted", "_idle", "_waiters", "cap", "open")

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("an open-connection cap is at least 1")
        self.cap = cap
        self.open = 0  # reserved or open
        self._counted: set[Closable] = set()
        self._idle: dict[Closable, None] = {}  # idle connections, the longest idle first
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def _queued(self) -> bool:
        """Whether anyone waits (the cancelled at the front are dropped on the way)."""
        waiters = self._waiters
        while waiters and waiters[0].done():
            waiters.popleft()
        return bool(waiters)

    async def reserve(self) -> None:
        """Room for one more connection: made by closing the longest idle, or waited for."""
        while self.open >= self.cap and self._idle:
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            oldest.abort()  # its pool hears `closed` at once
        if self.open >= self.cap or self._queued():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # a slot was handed over: `open` counts it already
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._free()  # handed over as we were cancelled: pass it on
                raise
            return
        self.open += 1

    def unreserve(self) -> None:
        """A reserved connection was never made."""
        self._free()

    def opened(self, conn: Closable) -> None:
        self._counted.add(conn)

    def idle(self, conn: Closable) -> None:
        """`conn` waits in its pool for reuse; closed at once if others wait for room."""
        if self._queued():
            conn.abort()
            return
        self._idle[conn] = None

    def busy(self, conn: Closable) -> None:
        self._idle.pop(conn, None)

    def closed(self, conn: Closable) -> None:
        """`conn` is gone (each connection once; unknown ones are ignored)."""
        self._idle.pop(conn, None)
        if conn in self._counted:
            self._counted.discard(conn)
            self._free()

    def _free(self) -> None:
        """One slot freed: handed to the first waiter, else counted down."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.open -= 1
