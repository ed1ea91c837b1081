"""Every turn being run, whatever its transport, and the one drain at shutdown.

`Gateway.run` enters each turn it runs (`tracking`): HTTP (aiohttp's handlers and the fast
path), WebSocket lanes and background turns alike. A background turn is held from the
moment it is accepted (`hold`), before its task even runs, so that a shutdown cannot miss
it. Whoever must end a turn early asks the registry (`stop`): a cancel asked for by a
client, or the shutdown deadline. The registry cancels the turn's task, and `Gateway.run`,
seeing why (`stopped`), ends the turn as that reason says; a cancel the registry did not
ask for (the client went away, its socket closed) ends nothing, as there is nobody to tell.

`drain` is the shutdown: no new turns from then on (`closing`, which the transports check
before they read a request), the turns in flight run until the deadline (those that start
meanwhile from what was accepted before, such as a WebSocket lane's queued creates, too),
then every one left is stopped at once and given a moment to write its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Iterator

from streamer.core.errors import shutting_down

END_WAIT = 1.0
"""Seconds the drain waits, past the deadline, for the stopped turns to write their end."""


class Stop(enum.Enum):
    """Why a turn is ended before its backend's answer did: how `Gateway.run` ends it."""

    CANCEL = "cancel"  # a client asked (`POST .../cancel`): the response ends `cancelled`
    SHUTDOWN = "shutdown"  # the shutdown deadline: `failed`, or a 503 if nothing was answered


class _Entry:
    __slots__ = ("held", "running", "stop")

    def __init__(self, held: bool) -> None:
        self.held = held  # registered before its run (a background turn): kept until its task ends
        self.running = False  # inside `Gateway.run`: a stop cancels its task
        self.stop: Stop | None = None


class InFlight:
    """The turns being run (by their task), why any was stopped, and the shutdown drain."""

    __slots__ = ("_left", "closing", "cut", "turns")

    def __init__(self) -> None:
        self.turns: dict[asyncio.Task[object], _Entry] = {}
        self.closing = False  # shutting down: the transports take no new request
        self.cut = False  # past the deadline: a turn that would start now is refused (503)
        self._left = asyncio.Event()  # a turn left (the drain waits on it)

    def __len__(self) -> int:
        return len(self.turns)

    def hold(self, task: asyncio.Task[object]) -> None:
        """`task` will run a turn (a background turn, accepted): drained from now until
        the task is done, whether or not its run has started."""
        self.turns[task] = _Entry(held=True)
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[object]) -> None:
        self.turns.pop(task, None)
        self._left.set()

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """The current task runs a turn while inside (`Gateway.run`); past the shutdown
        deadline a new turn is refused with a 503 (`RequestError`), nothing sent."""
        task = asyncio.current_task()
        assert task is not None
        entry = self.turns.get(task)
        if entry is None:
            if self.cut:
                raise shutting_down()
            entry = self.turns[task] = _Entry(held=False)
        entry.running = True
        if entry.stop is not None:  # stopped before it ran: it ends at its first wait
            task.cancel()
        try:
            yield
        finally:
            entry.running = False
            if not entry.held:
                self._release(task)

    def stop(self, task: asyncio.Task[object], why: Stop) -> None:
        """End `task`'s turn early, for `why` (the first reason given wins). A turn inside
        its run is cancelled now; a held one that has not started ends as soon as it does;
        one past its run is already ending."""
        entry = self.turns.get(task)
        if entry is None or entry.stop is not None:
            return
        entry.stop = why
        if entry.running:
            task.cancel()

    def stopped(self) -> Stop | None:
        """In a turn whose task was cancelled: why, if the registry stopped it (its cancel
        is then taken back); None if somebody else cancelled it too, or instead."""
        task = asyncio.current_task()
        entry = self.turns.get(task) if task is not None else None
        if task is None or entry is None or entry.stop is None:
            return None
        if task.uncancel() > 0:  # another cancel is pending as well: that one goes on
            return None
        return entry.stop

    async def drain(self, deadline: float) -> None:
        """The shutdown, once: the turns run until `deadline` (loop time), then the rest
        are stopped (`Stop.SHUTDOWN`) and get `END_WAIT` seconds to write their end."""
        self.closing = True
        await self._wait(deadline)
        if self.turns:
            self.cut = True
            for task in list(self.turns):
                self.stop(task, Stop.SHUTDOWN)
            await self._wait(asyncio.get_running_loop().time() + END_WAIT)

    async def _wait(self, deadline: float) -> None:
        """Until no turn is left, or `deadline`."""
        loop = asyncio.get_running_loop()
        while self.turns and (left := deadline - loop.time()) > 0:
            self._left.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._left.wait(), left)
