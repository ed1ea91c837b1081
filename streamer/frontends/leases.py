"""Background turns that lose their runner: the lease, and whoever ends a turn it lapsed on.

The instance running a background turn holds a lease on it in the store, taken before the
turn's record is written (`take`) and renewed every third of `--background-lease` seconds
(`keep`) until the turn ends (`release`). An instance that stops (kill -9, a lost host, a
killed `--workers` worker) stops renewing; once its lease lapses, the turn is ended
`failed` (`LAPSED`) by whoever sees that first (`end_if_lapsed`): a client polling it
(GET), a follower on any instance (`watch`, as often as a runner renews), or the sweep
every instance runs at startup and every `--background-lease` seconds (`sweep`). Its
followers, on every instance, get that terminal event from the log.

Ending claims the lapsed lease first, with a token of its own (`hold_lease`: of two
enders, one wins), kept as long as the record once the end is written, so a runner that
was only stalled for longer than the lease (its event loop, or its store) finds the lease
taken at its next renewal and stops without writing more (`keep` returns).

A turn is not run again elsewhere: the store keeps the response and its input, not the
request it was prepared from (tools, options, the client's forwarded key), and a backend
that had begun may have done work a second run would repeat. Its client learns it failed
and may create it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import orjson

from streamer.core.errors import failure
from streamer.core.response import usage_object
from streamer.store import ResponseStore, StoreUnavailable
from streamer.store.base import StoredResponse

log = logging.getLogger("streamer.frontends.leases")

RUNNING = ("queued", "in_progress")
LAPSED = (
    "The gateway instance running this background response stopped before it finished "
    "(its lease lapsed); create the response again."
)
SWEEP_LIMIT = 256  # lapsed turns one sweep ends at most (the next sweep takes the rest)


def running_background(response: dict[str, object]) -> bool:
    return bool(response.get("background")) and response.get("status") in RUNNING


class Leases:
    """This instance's leases on the background turns it runs, and the ending of any
    instance's turn whose lease lapsed."""

    __slots__ = ("holder", "keep_for", "seconds", "store", "sweeper")

    def __init__(self, store: ResponseStore, seconds: float, keep_for: float) -> None:
        self.store = store
        self.seconds = seconds  # --background-lease
        self.keep_for = keep_for  # an ender's claim, once the end is written: the record's TTL
        self.holder = uuid.uuid4().hex  # this instance, as a lease names it
        self.sweeper: asyncio.Task[None] | None = None

    @property
    def renew_every(self) -> float:
        return self.seconds / 3

    async def take(self, response_id: str) -> None:
        """The lease of a new response (before its record exists); StoreUnavailable."""
        await self.store.hold_lease(response_id, self.holder, self.seconds)

    async def keep(self, response_id: str) -> None:
        """Renew the lease until another holder has it, then return: the turn must stop,
        somebody else ended it. A renewal the store fails is tried again at the next one
        (the lease may lapse meanwhile; if nobody took it, it is taken again)."""
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                if not await self.store.hold_lease(response_id, self.holder, self.seconds):
                    log.warning("background response %s: its lease lapsed and was taken: "
                                "stopped, as it was ended elsewhere", response_id)  # fmt: skip
                    return
            except StoreUnavailable as exc:
                log.warning("background response %s: its lease was not renewed: %s",
                            response_id, exc)  # fmt: skip

    async def release(self, response_id: str) -> None:
        """The turn ended here: its lease goes (a store that fails lets it lapse)."""
        with contextlib.suppress(Exception):
            await self.store.release_lease(response_id, self.holder)

    async def end_if_lapsed(self, response_id: str) -> bool:
        """End the response `failed` if it is a background turn still running whose lease
        nobody holds; whether this call ended it. StoreUnavailable."""
        store = self.store
        if await store.lease_alive(response_id):
            return False
        record = await store.get(response_id)
        if record is None or not running_background(record.response):
            return False
        claim = f"ended:{uuid.uuid4().hex}"  # for as long as the end takes to write
        if not await store.hold_lease(response_id, claim, self.seconds):
            return False  # somebody else is ending it, or its runner came back
        log.warning("background response %s ended failed: nobody renewed its lease "
                    "(the instance running it stopped)", response_id)  # fmt: skip
        await end_failed(store, record, LAPSED)
        with contextlib.suppress(StoreUnavailable):  # kept: no stalled runner takes it back
            await store.hold_lease(response_id, claim, self.keep_for)
            await store.release_lease(response_id, None)
        return True

    async def watch(self, response_id: str) -> None:
        """A follower's part: end the response if its lease lapses (the follower then gets
        the end from the log, as every other follower does). Runs until cancelled."""
        while True:
            await asyncio.sleep(self.renew_every)
            with contextlib.suppress(StoreUnavailable):  # the follower's reads say so
                await self.end_if_lapsed(response_id)

    async def sweep(self) -> int:
        """End the listed turns whose lease lapsed; how many this call ended. A listed id
        whose record is gone or over (its runner could not let go) leaves the list."""
        store, ended = self.store, 0
        for response_id in await store.lapsed_leases(SWEEP_LIMIT):
            if await self.end_if_lapsed(response_id):
                ended += 1
            elif not await store.lease_alive(response_id):
                await store.release_lease(response_id, None)
        return ended

    def start_sweeping(self) -> None:
        """At once (the turns of an instance that stopped while this one was away), then
        every `--background-lease` seconds."""
        if self.sweeper is None:
            self.sweeper = asyncio.create_task(self._sweeping(), name="background lease sweep")

    async def _sweeping(self) -> None:
        while True:
            try:
                await self.sweep()
            except StoreUnavailable as exc:
                log.warning("the sweep for background turns nobody runs failed: %s", exc)
            except Exception:
                log.exception("the sweep for background turns nobody runs failed")
            await asyncio.sleep(self.seconds)

    async def close(self) -> None:
        task, self.sweeper = self.sweeper, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def end_failed(store: ResponseStore, record: StoredResponse, message: str) -> None:
    """End a running response nobody runs: `failed` with `message`, written to its record,
    then to its log (after its last event: a late writer is then ignored), then the end."""
    response_id, response = record.id, record.response
    last = await store.last_seq(response_id)
    response["status"] = "failed"
    response["error"] = failure("server_error", message)
    response["usage"] = response.get("usage") or usage_object()
    await store.put(record)
    if last is not None:
        event = {"type": "response.failed", "response": response, "sequence_number": last + 1}
        await store.append_event(response_id, last + 1, orjson.dumps(event))
    await store.end_events(response_id)
