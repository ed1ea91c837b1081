"""The Redis store: what lets several gateway instances share responses, streams and cancels.

Keys per response (hash-tagged on the id, so a Redis Cluster keeps them in one slot):
  {p}rec:{id}      hash, the whole record in one key: `r` the response, `i` its input
                   items (both orjson), `o` the owner and `a` the affinity key ("" if none).
                   One key, written by one HSET: a server that evicts keys (maxmemory)
                   evicts a record whole, never its history alone.
  {p}events:{id}   stream: entry id `0-<seq+1>` holds `d` (the event JSON) and `t` when
                   terminal; an entry with field `e` (auto id) marks the end of the stream
  {p}cancel:{id}   flag set by request_cancel; also published on the `{p}cancel` channel
  {p}item:{item}   the id of the response that last stored item `item` (input or output),
                   for item_reference; written apart from the record (its own slot)
  {p}lease:{id}    who runs the background turn (a holder token, with the lease's PX); taken,
                   renewed and let go by one-key scripts, so of two holders one wins
  {p}leases        sorted set of the ids with a lease, scored by when it lapses (ms, the
                   holder's clock): where the sweep looks for turns nobody runs any more
Everything carries the TTL; appending an event refreshes it for the whole response. Beside
them, `{p}secret:{name}` (no TTL: the shared state key) and `{p}probe` (readiness).

No command spans two slots and no MULTI is needed (each write that must be whole is one
command), so the same code runs on one server, a Cluster and a Sentinel-managed master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException, RedisError, ResponseError
from redis.typing import EncodableT, FieldT

from streamer.store.base import (
    Incomplete,
    IncompleteRecord,
    Order,
    StoredResponse,
    StoreUnavailable,
    find_item,
    is_terminal,
    page_items,
    record_item_ids,
    report_incomplete,
    visible,
    why,
    with_item_ids,
)
from streamer.store.redis_checks import config_advice
from streamer.store.redis_connect import TLS, connect, parse

log = logging.getLogger("streamer.store")

T = TypeVar("T")
# One XREAD answer for one stream: its entries, each an id and its fields (bytes, undecoded).
StreamEntries = list[tuple[bytes, dict[bytes, bytes]]]
_FIELDS = ("r", "i", "o", "a")
# A lease kept or taken: free, lapsed or already the holder's (1), else another's (0).
_HOLD = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_LET_GO = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore:
    """A `ResponseStore` on `redis.asyncio`. Every call either answers or raises
    `StoreUnavailable` within about `connect_timeout + op_timeout` seconds."""

    shared = True
    durable = True  # as durable as the server's persistence (checked: `check`)

    def __init__(
        self,
        url: str,
        ttl_seconds: float = 3600.0,
        key_prefix: str = "streamer:",
        *,
        connect_timeout: float = 1.0,
        op_timeout: float = 2.0,
        block_seconds: float = 10.0,
        tls: TLS | None = None,
        on_incomplete: Incomplete | None = None,
    ) -> None:
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError("the store key prefix may not hold { or } (Redis Cluster hash tags)")
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.prefix = key_prefix
        self.on_incomplete = on_incomplete
        self.target = parse(url)
        self._op_timeout = op_timeout
        self._deadline = connect_timeout + op_timeout + 0.5  # a hard cap above the sockets'
        self._block_ms = int(block_seconds * 1000)
        self._block_deadline = self._deadline + block_seconds
        options: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout,
            # One quick retry on a dropped connection (a stale pooled socket), none on timeouts.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        }
        tls = tls or TLS()
        self._r = connect(self.target, tls, socket_timeout=op_timeout, **options)
        # XREAD BLOCK needs a read timeout longer than the block itself: its own pool.
        self._rb = connect(self.target, tls, socket_timeout=block_seconds + op_timeout, **options)
        self._channel = f"{key_prefix}cancel".encode()
        self._leases = f"{key_prefix}leases"
        self._probe = f"{key_prefix}probe:{{{os.urandom(6).hex()}}}"
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._closed = False  # a closed store's listener does not resubscribe
        self._subscribed = asyncio.Event()
        self._failed = asyncio.Event()
        self._listen_error: BaseException | None = None

    def _key(self, kind: str, response_id: str) -> str:
        return f"{self.prefix}{kind}:{{{response_id}}}"

    async def _call(self, awaitable: Awaitable[T], deadline: float | None = None) -> T:
        """Await one Redis operation, turning any failure or overrun into StoreUnavailable."""
        try:
            async with asyncio.timeout(deadline or self._deadline):
                return await awaitable
        except MovedError as exc:
            raise StoreUnavailable(
                f"{self.target.shown} is a node of a Redis Cluster ({exc}): use "
                "redis+cluster://host:port,… as --store"
            ) from exc
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis store unavailable: {why(exc)}") from exc

    # -- records ---------------------------------------------------------------------------

    async def put(self, record: StoredResponse) -> None:
        response_id = record.id
        rkey = self._key("rec", response_id)
        items = with_item_ids(record.input_items)
        mapping: dict[FieldT, EncodableT] = {
            "r": orjson.dumps(record.response),
            "i": orjson.dumps(items),
            "o": (record.owner or "").encode(),
            "a": (record.affinity or "").encode(),
        }
        pipe = self._r.pipeline(transaction=False)
        pipe.hset(rkey, mapping=mapping)  # every field at once: the record is whole
        pipe.pexpire(rkey, self.ttl_ms)
        for item_id in record_item_ids(record.response, items):  # each in its own slot
            pipe.set(self._item_key(item_id), response_id.encode(), px=self.ttl_ms)
        await self._call(pipe.execute())

    async def get_item(self, item_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        response_id = _text(await self._call(self._r.get(self._item_key(item_id))))
        if response_id is None:
            return None
        record = await self.get(response_id, owner=owner)
        return find_item(record, item_id) if record is not None else None

    async def _unindex(self, record: StoredResponse) -> None:
        """Drop the item pointers that lead to this response (not those a later one took)."""
        keys = [self._item_key(i) for i in record_item_ids(record.response, record.input_items)]
        if not keys:
            return
        reads = self._r.pipeline(transaction=False)  # one slot per key: no MGET
        for key in keys:
            reads.get(key)
        pointers = await self._call(reads.execute())
        mine = [k for k, v in zip(keys, pointers, strict=True) if _text(v) == record.id]
        if mine:
            pipe = self._r.pipeline(transaction=False)
            for key in mine:
                pipe.delete(key)
            await self._call(pipe.execute())

    def _item_key(self, item_id: str) -> str:
        return f"{self.prefix}item:{{{item_id}}}"

    async def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
        rkey = self._key("rec", response_id)
        response, items, stored_owner, affinity = await self._call(self._r.hmget(rkey, _FIELDS))
        if response is None and items is None:
            return None
        if response is None or items is None:
            missing = "response" if response is None else "input items"
            report_incomplete(self.on_incomplete, "record", response_id, f"no {missing}")
            return None
        record_owner = _text(stored_owner)
        if not visible(record_owner, owner):
            return None
        return StoredResponse(
            orjson.loads(response), orjson.loads(items), record_owner, _text(affinity)
        )

    async def get_response(
        self, response_id: str, *, owner: str | None = None
    ) -> dict[str, Any] | None:
        rkey = self._key("rec", response_id)
        response, stored_owner = await self._call(self._r.hmget(rkey, ["r", "o"]))
        if response is None or not visible(_text(stored_owner), owner):
            return None
        return orjson.loads(response)

    async def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        record = await self.get(response_id)
        if record is not None and not visible(record.owner, owner):
            return False  # another client's: it stays, as if it did not exist
        if record is not None:
            await self._unindex(record)
        skey = self._key("events", response_id)
        # End the stream first, as its own command, so blocked followers are served the
        # end marker before the key disappears.
        await self._call(self._r.xadd(skey, {"e": b"1"}, nomkstream=True))
        rkey, ckey = self._key("rec", response_id), self._key("cancel", response_id)
        await self._call(self._r.delete(skey, ckey))
        return bool(await self._call(self._r.delete(rkey)))

    async def input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any] | None:
        rkey = self._key("rec", response_id)
        items, stored_owner = await self._call(self._r.hmget(rkey, ["i", "o"]))
        if items is None or not visible(_text(stored_owner), owner):
            return None
        return page_items(orjson.loads(items), limit=limit, order=order, after=after)

    # -- background event streams ----------------------------------------------------------

    async def append_event(self, response_id: str, seq: int, data: bytes) -> None:
        if seq < 0:
            raise ValueError("seq must be >= 0")
        skey, rkey = self._key("events", response_id), self._key("rec", response_id)
        terminal = is_terminal(data)
        fields: dict[FieldT, EncodableT] = {"d": data, "t": b"1"} if terminal else {"d": data}
        pipe = self._r.pipeline(transaction=False)
        # The seq is the entry id, so replay-after-N is a plain XREAD from 0-(N+1) and
        # Redis itself rejects duplicate or out-of-order seqs and appends after the end.
        # Only the first event makes the stream: a log the server evicted (or a delete
        # removed) is not begun again from the middle, which would replay with a hole.
        pipe.xadd(skey, fields, id=f"0-{seq + 1}", nomkstream=seq > 0)
        if terminal:
            pipe.xadd(skey, {"e": b"1"}, nomkstream=True)
        pipe.pexpire(skey, self.ttl_ms)
        pipe.pexpire(rkey, self.ttl_ms)
        added, *_, kept = await self._call(pipe.execute(raise_on_error=False))
        if isinstance(added, ResponseError) and "equal or smaller" not in str(added):
            raise StoreUnavailable(f"redis store error: {added}")
        if added is None and kept:  # no stream, yet the record is there: the log was lost
            report_incomplete(self.on_incomplete, "events", response_id, "its log is gone")

    async def events(
        self, response_id: str, *, after: int = -1
    ) -> AsyncIterator[tuple[int, bytes]]:
        skey, rkey = self._key("events", response_id), self._key("rec", response_id)
        if not await self._call(self._r.exists(skey, rkey)):
            return
        cursor: bytes | str = f"0-{max(after, -1) + 1}"
        while True:
            # RESP2, undecoded: a list of [stream, entries]; redis-py's type is a wider union.
            reply: Any = await self._call(
                self._rb.xread({skey: cursor}, count=512, block=self._block_ms),
                self._block_deadline,
            )
            if not reply:
                # Quiet for a whole block: stop if the response is gone altogether.
                if await self._log_is_over(response_id, skey, rkey):
                    return
                continue
            entries: StreamEntries = reply[0][1]
            for entry_id, fields in entries:
                cursor = entry_id
                if b"e" in fields:
                    return
                yield int(entry_id.split(b"-")[1]) - 1, fields[b"d"]
                if b"t" in fields:
                    return

    async def _log_is_over(self, response_id: str, skey: str, rkey: str) -> bool:
        """After a quiet block: whether nothing more can come (the response is gone). A
        record that ended while its log is missing lost the log: IncompleteRecord."""
        pipe = self._r.pipeline(transaction=False)
        pipe.exists(skey)
        pipe.hget(rkey, "r")
        has_log, response = await self._call(pipe.execute())
        if has_log:
            return False
        if response is None:
            return True
        status = orjson.loads(response).get("status")
        if status in ("queued", "in_progress"):
            return False  # its writer has not started the log yet, or goes on without it
        report_incomplete(self.on_incomplete, "events", response_id, "its log is gone")
        raise IncompleteRecord(f"the event log of {response_id} was lost by the store")

    async def end_events(self, response_id: str) -> None:
        skey = self._key("events", response_id)
        pipe = self._r.pipeline(transaction=False)
        pipe.xadd(skey, {"e": b"1"})
        pipe.pexpire(skey, self.ttl_ms)
        await self._call(pipe.execute())

    async def last_seq(self, response_id: str) -> int | None:
        entries = await self._call(self._r.xrevrange(self._key("events", response_id), count=1))
        if not entries:
            return -1
        entry_id, fields = entries[0]
        if b"e" in fields or b"t" in fields:  # ended (a terminal entry has its end after it)
            return None
        return int(entry_id.split(b"-")[1]) - 1

    # -- leases ----------------------------------------------------------------------------

    async def hold_lease(self, response_id: str, holder: str, seconds: float) -> bool:
        ms = max(1, int(seconds * 1000))
        key = self._key("lease", response_id)
        if not await self._call(self._r.eval(_HOLD, 1, key, holder, ms)):
            return False
        lapses = int(time.time() * 1000) + ms
        await self._call(self._r.zadd(self._leases, {response_id: lapses}))
        return True

    async def lease_alive(self, response_id: str) -> bool:
        return bool(await self._call(self._r.exists(self._key("lease", response_id))))

    async def release_lease(self, response_id: str, holder: str | None) -> None:
        if holder is not None:
            key = self._key("lease", response_id)
            await self._call(self._r.eval(_LET_GO, 1, key, holder))
        await self._call(self._r.zrem(self._leases, response_id))

    async def lapsed_leases(self, limit: int) -> list[str]:
        now = int(time.time() * 1000)
        due = await self._call(self._r.zrangebyscore(self._leases, "-inf", now, 0, limit))
        ids = [_text(i) or "" for i in due]
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)  # one slot per lease: no MGET
        for response_id in ids:
            pipe.exists(self._key("lease", response_id))
        held = await self._call(pipe.execute())
        return [i for i, alive in zip(ids, held, strict=True) if not alive]

    # -- cancellation ----------------------------------------------------------------------

    async def request_cancel(self, response_id: str) -> None:
        # The flag first: a waiter subscribing meanwhile finds it once subscribed.
        await self._call(self._r.set(self._key("cancel", response_id), b"1", px=self.ttl_ms))
        await self._call(self._r.publish(self._channel, response_id.encode()))
        self._wake(response_id)

    async def wait_cancel(self, response_id: str) -> None:
        event = asyncio.Event()
        self._waiters.setdefault(response_id, set()).add(event)
        try:
            await self._ensure_listening()
            # Checked only once subscribed: a cancel published earlier left this flag.
            if await self._call(self._r.exists(self._key("cancel", response_id))):
                return
            await event.wait()
        finally:
            waiters = self._waiters.get(response_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[response_id]

    def _wake(self, response_id: str) -> None:
        for event in self._waiters.get(response_id, ()):
            event.set()

    async def _ensure_listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._subscribed.clear()
            self._failed.clear()
            self._listener = asyncio.create_task(self._listen(), name="streamer-cancel-listener")
        if self._subscribed.is_set():
            return
        if not self._failed.is_set():
            waits = {
                asyncio.ensure_future(self._subscribed.wait()),
                asyncio.ensure_future(self._failed.wait()),
            }
            try:
                await asyncio.wait(waits, timeout=self._deadline, return_when="FIRST_COMPLETED")
            finally:
                for wait in waits:
                    wait.cancel()
        if not self._subscribed.is_set():
            raise StoreUnavailable(
                f"redis store unavailable: cannot subscribe: {self._listen_error!r}"
            )

    async def _listen(self) -> None:
        """One subscription per store, shared by every waiter; resubscribes after outages."""
        while True:
            self._failed.clear()
            pubsub = self._r.pubsub()
            try:
                async with asyncio.timeout(self._deadline):
                    if self.target.kind == "cluster":  # its pub/sub needs the slot map first
                        await self._r.initialize()
                    await pubsub.subscribe(self._channel)
                    # Redis delivers publishes only after confirming the SUBSCRIBE.
                    while True:
                        message = await pubsub.get_message(timeout=self._op_timeout)
                        if message is not None and message["type"] == "subscribe":
                            break
                self._subscribed.set()
                await self._recheck_flags()
                while True:
                    message = await pubsub.get_message(timeout=30.0)
                    if message is None:
                        await pubsub.ping()  # a heartbeat: surfaces a dead connection
                    elif message["type"] == "message":
                        self._wake(message["data"].decode())
            except (RedisError, OSError, TimeoutError, StoreUnavailable) as exc:
                self._subscribed.clear()
                self._listen_error = exc
                self._failed.set()
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            if self._closed or not self._waiters:
                return  # nobody to serve; the next wait_cancel starts a new listener
            await asyncio.sleep(1.0)  # back off before resubscribing

    async def _recheck_flags(self) -> None:
        """After (re)subscribing, cancels published while unsubscribed are only in the flags."""
        ids = list(self._waiters)
        if not ids:
            return
        pipe = self._r.pipeline(transaction=False)  # one slot per flag: no MGET
        for response_id in ids:
            pipe.exists(self._key("cancel", response_id))
        flags = await self._call(pipe.execute())
        for response_id, flag in zip(ids, flags, strict=True):
            if flag:
                self._wake(response_id)

    # -- the store itself ------------------------------------------------------------------

    async def ping(self) -> bool:
        """A write (a probe key that expires): a full `noeviction` server, a read-only
        replica or a Cluster node asked for the wrong slot all answer no."""
        try:
            return bool(await self._call(self._r.set(self._probe, b"1", px=60_000)))
        except StoreUnavailable:
            return False

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        key = f"{self.prefix}secret:{{{name}}}"
        pipe = self._r.pipeline(transaction=False)
        pipe.set(key, candidate, nx=True)  # no TTL: it must outlive every record
        pipe.get(key)
        _, kept = await self._call(pipe.execute())
        return bytes(kept) if kept is not None else candidate

    async def check(self) -> list[str]:
        return await config_advice(self._r, self.target, self._deadline)

    async def close(self) -> None:
        self._closed = True
        listener, self._listener = self._listener, None
        # On Python 3.11 a cancel that lands as an `asyncio.timeout` expires becomes a
        # TimeoutError the listener handles (and would resubscribe after): ask again until
        # it has stopped, so closing never waits on a listener that kept running.
        while listener is not None and not listener.done():
            listener.cancel()
            await asyncio.wait({listener}, timeout=1.0)
        if listener is not None and not listener.cancelled():
            listener.exception()  # retrieved: its outcome was already recorded as the error
        try:  # bounded: a shutdown never waits on a server that stopped answering
            async with asyncio.timeout(self._deadline):
                await self._r.aclose()
                await self._rb.aclose()
        except TimeoutError:
            log.warning(
                "redis store: closing its connections timed out after %.1f s", self._deadline
            )


def _text(value: bytes | str | None) -> str | None:
    """A field read back (bytes, as the client does not decode), as text; None if unset."""
    if isinstance(value, bytes):
        return value.decode() or None
    return value or None
