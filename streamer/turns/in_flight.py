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

RESTOP = 0.5
"""Seconds after which a stop the turn has not taken is asked for again. A cancel can be
lost on Python 3.11: `asyncio.wait_for` (redis-py waits with it) returns a result that was
ready at the moment of the cancel instead of raising it (CPython gh-86296, fixed in 3.12);
a background turn writing to Redis when its cancel came then ran on."""


class Stop(enum.Enum):
    """Why a turn is ended before its backend's answer did: how `Gateway.run` ends it."""

    CANCEL = "cancel"  # a client asked (`POST .../cancel`): the response ends `cancelled`
    SHUTDOWN = "shutdown"  # the shutdown deadline: `failed`, or a 503 if nothing was answered


class _Entry:
    __slots__ = ("cancels", "ending", "held", "running", "stop")

    def __init__(self, held: bool) -> None:
        self.held = held  # registered before its run (a background turn): kept until its task ends
        self.running = False  # inside `Gateway.run`: a stop cancels its task
        self.stop: Stop | None = None
        self.ending = False  # `Gateway.run` took the stop and is ending the turn
        self.cancels = 0  # the registry's cancels of its task (a lost one stays counted)

    def cancel(self, task: asyncio.Task[object]) -> None:
        task.cancel()
        self.cancels += 1


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
            entry.cancel(task)
        try:
            yield
        finally:
            entry.running = False
            if not entry.held:
                self._release(task)

    def stop(self, task: asyncio.Task[object], why: Stop) -> None:
        """End `task`'s turn early, for `why` (the first reason given wins). A turn inside
        its run is cancelled now (again, if an earlier stop has not reached it yet); a held
        one that has not started ends as soon as it does; one past its run, or already
        ending, is left to end."""
        entry = self.turns.get(task)
        if entry is None or entry.ending:
            return
        if entry.stop is None:
            entry.stop = why
        if entry.running:
            entry.cancel(task)
            asyncio.get_running_loop().call_later(RESTOP, self._restop, task)

    def _restop(self, task: asyncio.Task[object]) -> None:
        """A stop not yet taken (its cancel was lost) is asked for again."""
        entry = self.turns.get(task)
        if entry is not None and entry.stop is not None and not entry.ending:
            self.stop(task, entry.stop)

    def stopped(self) -> Stop | None:
        """In a turn whose task was cancelled: why, if the registry stopped it (its cancels,
        a lost one too, are then taken back, and the turn is ending: no later stop cancels
        it again); None if somebody else cancelled it."""
        task = asyncio.current_task()
        entry = self.turns.get(task) if task is not None else None
        if task is None or entry is None or entry.stop is None:
            return None
        for _ in range(entry.cancels):
            task.uncancel()
        entry.cancels, entry.ending = 0, True
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
