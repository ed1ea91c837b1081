"""The in-process store: bounded by count and bytes, with a TTL, oldest written evicted first.

Records are kept as orjson bytes, so the byte bound measures what is really held and every
read hands out a fresh copy (the same isolation the Redis store gives).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from streamer.store.base import (
    Order,
    StoredResponse,
    find_item,
    input_ids,
    is_terminal,
    page_items,
    record_item_ids,
    visible,
    with_item_ids,
)
from streamer.store.cancels import Cancels

MiB = 1024 * 1024
MAX_PIECES = 32  # a record's pieces past this are joined into one (a long session)
_ENTRY_OVERHEAD = 256  # dict slots, keys and bookkeeping, roughly
_EVENT_OVERHEAD = 64


class _Log:
    """One background response's events, plus a wake-up for its followers."""

    __slots__ = ("changed", "done", "events", "size")

    def __init__(self) -> None:
        self.events: list[tuple[int, bytes]] = []
        self.done = False
        self.size = 0
        self.changed = asyncio.Event()

    def wake(self) -> None:
        # A fresh Event per change: followers wait on the one they saw, no lock needed.
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def finish(self) -> None:
        self.done = True
        self.wake()


class _Chain:
    """Records that each took over all the ids of the one before (`StoredResponse.extends`):
    the item index points an id at its chain, and the chain's `head` (its latest record,
    which holds every id of it) answers for it; `ids`: every id pointed here."""

    __slots__ = ("head", "ids", "whole")

    def __init__(self, head: str, ids: list[str]) -> None:
        self.head: str | None = head
        self.ids = ids
        self.whole = True  # every id pointed here still is (False: another record took some)


@dataclass(slots=True)
class _Lease:
    holder: str
    expires: float
    listed: bool = True  # among the leases `lapsed_leases` looks at (until released)


@dataclass(slots=True)
class _Entry:
    expires: float
    response: bytes | None = None  # None: only an event log exists so far
    # the input items' JSON, as pieces (the elements, comma-joined, no brackets): a record
    # that extends another shares its pieces (`StoredResponse.extends`), so a conversation
    # of T turns holds its history once, not T times; `count`: the items in them
    items: tuple[bytes, ...] = ()
    count: int = 0
    owner: str | None = None
    affinity: str | None = None
    log: _Log | None = None
    size: int = 0
    chain: _Chain | None = None  # where its ids are indexed (None: no record yet)
    output_ids: list[str] = field(default_factory=list)  # its output items' ids
    own_ids: int = 0  # the ids it added to the index, and their characters
    own_id_chars: int = 0

    def measure(self) -> int:
        """What it holds, shared pieces counted in every record that holds them."""
        record = len(self.response or b"") + sum(map(len, self.items)) + len(self.owner or "")
        record += len(self.affinity or "") + self.own_id_chars + _ENTRY_OVERHEAD * self.own_ids
        return _ENTRY_OVERHEAD + record + (self.log.size if self.log else 0)

    def items_json(self) -> bytes:
        return b"[" + b",".join(self.items) + b"]"


def _continued_chain(
    base: _Entry | None, record: StoredResponse, new_ids: list[str]
) -> _Chain | None:
    """`base`'s chain if `record` takes over every id of it: `base` is the chain's latest
    record, its output is in `record`'s input, and no other record took ids of the chain
    since (a fork from an earlier record, or one without that output, or after another
    took some, starts a chain of its own)."""
    if base is None or base.chain is None or record.extends is None or not base.chain.whole:
        return None
    if base.chain.head != record.extends[0] or not set(base.output_ids) <= set(new_ids):
        return None
    return base.chain


def _capped(pieces: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return (b",".join(pieces),) if len(pieces) > MAX_PIECES else pieces


class MemoryStore:
    """A single gateway's store. Eviction and expiry also end the evicted event logs."""

    shared = False
    durable = False

    def __init__(
        self,
        max_responses: int = 10_000,
        max_bytes: int = 256 * MiB,
        ttl_seconds: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._cancels = Cancels(max_responses, ttl_seconds, clock)
        # item id -> the chain of the live record that last held it (item_reference); a
        # chain's ids leave with its head, so the index is bounded by the records (and
        # counted in their size)
        self._items: dict[str, _Chain] = {}
        self._bytes = 0
        self._secrets: dict[str, bytes] = {}
        # response id -> its lease (background turns running, and the turns being ended);
        # at most `max_responses`, the lapsed ones that are no longer listed dropped first
        self._leases: dict[str, _Lease] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_used(self) -> int:
        return self._bytes

    # -- records ---------------------------------------------------------------------------

    async def put(self, record: StoredResponse) -> None:
        response_id = record.id
        entry = self._live(response_id) or self._insert(response_id)
        entry.response = orjson.dumps(record.response)
        entry.owner = record.owner
        entry.affinity = record.affinity
        self._unindex(response_id, entry)
        base = self._base(record, response_id)
        entry.output_ids = record_item_ids(record.response, ())
        if base is None:
            items = with_item_ids(record.input_items)
            entry.items = (orjson.dumps(items)[1:-1],) if items else ()
        else:  # its first items are `base`'s: only the rest is encoded
            items = with_item_ids(record.input_items[base.count :])
            blob = (orjson.dumps(items)[1:-1],) if items else ()
            entry.items = _capped((*base.items, *blob))
        entry.count = len(record.input_items)
        new_ids = list(dict.fromkeys([*input_ids(items), *entry.output_ids]))
        chain = _continued_chain(base, record, new_ids)
        if chain is None:  # a chain of its own: every id it holds points here
            every = input_ids(with_item_ids(record.input_items)) if base is not None else []
            new_ids = list(dict.fromkeys([*every, *new_ids]))
            chain = _Chain(response_id, [])
            for taken in set(map(self._items.get, new_ids)) - {None}:
                taken.whole = False  # type: ignore[union-attr]  # some of its ids are ours
        else:  # its base's chain goes on in it: the ids already there stay, pointing at it
            chain.head = response_id
            new_ids = [i for i in new_ids if self._items.get(i) is not chain]
            for taken in set(map(self._items.get, new_ids)) - {None}:
                taken.whole = False  # type: ignore[union-attr]  # (an id met again)
        entry.chain = chain
        chain.ids += new_ids
        self._items.update(dict.fromkeys(new_ids, chain))
        entry.own_ids, entry.own_id_chars = len(new_ids), sum(map(len, new_ids))
        self._written(response_id, entry)

    def _base(self, record: StoredResponse, response_id: str) -> _Entry | None:
        """The live record `record` extends, if it holds what the hint says it does."""
        if record.extends is None:
            return None
        base_id, count = record.extends
        base = self._live(base_id) if base_id != response_id else None
        if base is None or base.response is None or base.count != count:
            return None
        if count > len(record.input_items):
            return None
        return base

    async def get_item(self, item_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        chain = self._items.get(item_id)
        response_id = chain.head if chain is not None else None
        record = await self.get(response_id, owner=owner) if response_id is not None else None
        return find_item(record, item_id) if record is not None else None

    def _unindex(self, response_id: str, entry: _Entry) -> None:
        """Its ids leave the index if it is its chain's head (the last record to hold them,
        as the plain index would have them point); a record before it leaves none."""
        chain, entry.chain = entry.chain, None
        if chain is None or chain.head != response_id:
            return
        chain.head = None
        items = self._items
        for item_id in chain.ids:
            if items.get(item_id) is chain:
                del items[item_id]
        chain.ids = []

    async def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
        entry = self._record(response_id, owner)
        if entry is None or entry.response is None:
            return None
        return StoredResponse(
            orjson.loads(entry.response),
            orjson.loads(entry.items_json()),
            entry.owner,
            entry.affinity,
        )

    async def get_response(
        self, response_id: str, *, owner: str | None = None
    ) -> dict[str, Any] | None:
        entry = self._record(response_id, owner)
        if entry is None or entry.response is None:
            return None
        return orjson.loads(entry.response)

    async def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        if self._record(response_id, owner) is None and self._live(response_id) is not None:
            return False  # another client's: it stays, as if it did not exist
        entry = self._live(response_id)
        self._cancels.forget(response_id)
        if entry is None:
            return False
        self._drop(response_id)
        return entry.response is not None

    async def input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any] | None:
        entry = self._record(response_id, owner)
        if entry is None or entry.response is None:
            return None
        return page_items(orjson.loads(entry.items_json()), limit=limit, order=order, after=after)

    # -- background event logs -------------------------------------------------------------

    async def append_event(self, response_id: str, seq: int, data: bytes) -> None:
        if seq < 0:
            raise ValueError("seq must be >= 0")
        entry = self._live(response_id) or self._insert(response_id)
        log = entry.log = entry.log or _Log()
        if log.done or (log.events and seq <= log.events[-1][0]):
            return
        log.events.append((seq, data))
        log.size += len(data) + _EVENT_OVERHEAD
        if is_terminal(data):
            log.done = True
        log.wake()
        self._written(response_id, entry)

    async def events(
        self, response_id: str, *, after: int = -1
    ) -> AsyncIterator[tuple[int, bytes]]:
        entry = self._live(response_id)
        if entry is None:
            return
        log = entry.log = entry.log or _Log()
        # Our own reference: eviction finishes the log, which wakes and ends this follower.
        i = bisect.bisect_right(log.events, after, key=lambda event: event[0])
        while True:
            while i < len(log.events):
                seq, data = log.events[i]
                i += 1
                if seq > after:  # events at or below `after` may arrive after we started
                    yield seq, data
            if log.done:
                return
            await log.changed.wait()

    async def end_events(self, response_id: str) -> None:
        entry = self._live(response_id)
        if entry is not None:
            entry.log = entry.log or _Log()
            entry.log.finish()

    async def last_seq(self, response_id: str) -> int | None:
        entry = self._live(response_id)
        log = entry.log if entry is not None else None
        if log is None:
            return -1
        if log.done:
            return None
        return log.events[-1][0] if log.events else -1

    # -- leases ----------------------------------------------------------------------------

    async def hold_lease(self, response_id: str, holder: str, seconds: float) -> bool:
        now = self._clock()
        lease = self._leases.get(response_id)
        if lease is not None and lease.expires > now and lease.holder != holder:
            return False
        self._leases[response_id] = _Lease(holder, now + seconds)
        if len(self._leases) > self.max_responses:
            self._trim_leases(now)
        return True

    async def lease_alive(self, response_id: str) -> bool:
        lease = self._leases.get(response_id)
        return lease is not None and lease.expires > self._clock()

    async def release_lease(self, response_id: str, holder: str | None) -> None:
        lease = self._leases.get(response_id)
        if lease is None:
            return
        lease.listed = False
        if lease.holder == holder or lease.expires <= self._clock():
            del self._leases[response_id]

    async def lapsed_leases(self, limit: int) -> list[str]:
        now = self._clock()
        lapsed = (i for i, lease in self._leases.items() if lease.listed and lease.expires <= now)
        return [i for _, i in zip(range(limit), lapsed, strict=False)]

    def _trim_leases(self, now: float) -> None:
        """Over the bound: the lapsed leases nobody lists go, then the oldest taken."""
        for response_id, lease in list(self._leases.items()):
            if not lease.listed and lease.expires <= now:
                del self._leases[response_id]
        while len(self._leases) > self.max_responses:
            del self._leases[next(iter(self._leases))]

    # -- cancellation ----------------------------------------------------------------------

    async def request_cancel(self, response_id: str) -> None:
        self._cancels.request(response_id)

    async def wait_cancel(self, response_id: str) -> None:
        await self._cancels.wait(response_id)

    async def ping(self) -> bool:
        return True

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        return self._secrets.setdefault(name, candidate)

    async def check(self) -> list[str]:
        return []

    async def close(self) -> None:
        # Nothing else in this process will append: let every follower finish.
        for entry in self._entries.values():
            if entry.log is not None:
                entry.log.finish()

    # -- bookkeeping -----------------------------------------------------------------------

    def _live(self, response_id: str) -> _Entry | None:
        entry = self._entries.get(response_id)
        if entry is not None and entry.expires <= self._clock():
            self._drop(response_id)
            return None
        return entry

    def _record(self, response_id: str, owner: str | None) -> _Entry | None:
        """The live entry, if `owner` may see it."""
        entry = self._live(response_id)
        return entry if entry is not None and visible(entry.owner, owner) else None

    def _insert(self, response_id: str) -> _Entry:
        entry = self._entries[response_id] = _Entry(expires=self._clock() + self.ttl_seconds)
        return entry

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        self._unindex(response_id, entry)
        self._bytes -= entry.size
        if entry.log is not None:
            entry.log.finish()

    def _written(self, response_id: str, entry: _Entry) -> None:
        """Refresh the entry's TTL and size, then expire and evict from the oldest end."""
        now = self._clock()
        entry.expires = now + self.ttl_seconds
        self._entries.move_to_end(response_id)
        size = entry.measure()
        self._bytes += size - entry.size
        entry.size = size
        # Entries are ordered by last write and share one TTL, so the oldest expire first.
        while len(self._entries) > 1:
            oldest_id, oldest = next(iter(self._entries.items()))
            over = len(self._entries) > self.max_responses or self._bytes > self.max_bytes
            if oldest.expires > now and not over:
                break
            # The entry just written always stays, even when it alone exceeds max_bytes.
            self._drop(oldest_id)
