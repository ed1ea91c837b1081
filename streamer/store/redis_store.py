"""The Redis store: what lets several gateway instances share responses, streams and cancels.

Keys per response (hash-tagged on the id so a cluster keeps them in one slot):
  {p}resp:{id}     hash: `response` (orjson), `owner` (a client identity, if any)
  {p}items:{id}    list: the input items in input order, one orjson value each
  {p}itemidx:{id}  hash: item id -> index in that list (input_items `after` cursors)
  {p}events:{id}   stream: entry id `0-<seq+1>` holds `d` (the event JSON) and `t` when
                   terminal; an entry with field `e` (auto id) marks the end of the stream
  {p}cancel:{id}   flag set by request_cancel; also published on the `{p}cancel` channel
  {p}item:{item}   the id of the response that last stored item `item` (input or output),
                   for item_reference; written apart from the record (its own slot)
Everything carries the TTL; appending an event refreshes it for the whole response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT, FieldT

from streamer.store.base import (
    Order,
    StoredResponse,
    StoreUnavailable,
    check_page_args,
    find_item,
    is_terminal,
    list_page,
    record_item_ids,
    visible,
    with_item_ids,
)

T = TypeVar("T")
# One XREAD answer for one stream: its entries, each an id and its fields (bytes, undecoded).
StreamEntries = list[tuple[bytes, dict[bytes, bytes]]]


class RedisStore:
    """A `ResponseStore` on `redis.asyncio`. Every call either answers or raises
    `StoreUnavailable` within about `connect_timeout + op_timeout` seconds."""

    def __init__(
        self,
        url: str,
        ttl_seconds: float = 3600.0,
        key_prefix: str = "streamer:",
        *,
        connect_timeout: float = 1.0,
        op_timeout: float = 2.0,
        block_seconds: float = 10.0,
    ) -> None:
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.prefix = key_prefix
        self._op_timeout = op_timeout
        self._deadline = connect_timeout + op_timeout + 0.5  # a hard cap above the sockets'
        self._block_ms = int(block_seconds * 1000)
        self._block_deadline = self._deadline + block_seconds
        options: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout,
            # One quick retry on a dropped connection (a stale pooled socket), none on timeouts.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        }
        self._r = aioredis.Redis.from_url(url, socket_timeout=op_timeout, **options)
        # XREAD BLOCK needs a read timeout longer than the block itself: its own pool.
        self._rb = aioredis.Redis.from_url(
            url, socket_timeout=block_seconds + op_timeout, **options
        )
        self._channel = f"{key_prefix}cancel".encode()
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
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
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis store unavailable: {exc!r}") from exc

    # -- records ---------------------------------------------------------------------------

    async def put(self, record: StoredResponse) -> None:
        response_id = record.id
        rkey, lkey, ikey = self._record_keys(response_id)
        items = with_item_ids(record.input_items)
        pipe = self._r.pipeline(transaction=True)
        mapping: dict[FieldT, EncodableT] = {"response": orjson.dumps(record.response)}
        if record.owner:
            mapping["owner"] = record.owner.encode()
        pipe.hset(rkey, mapping=mapping)
        if not record.owner:
            pipe.hdel(rkey, "owner")
        pipe.delete(lkey, ikey)
        if items:
            pipe.rpush(lkey, *(orjson.dumps(item) for item in items))
            index: dict[FieldT, EncodableT] = {}
            for i, item in enumerate(items):
                index.setdefault(str(item["id"]), i)  # the first occurrence, as page_items
            pipe.hset(ikey, mapping=index)
        for key in (rkey, lkey, ikey):
            pipe.pexpire(key, self.ttl_ms)
        await self._call(pipe.execute())
        item_ids = record_item_ids(record.response, items)
        if item_ids:  # each key in its own slot: not one transaction
            pointers = self._r.pipeline(transaction=False)
            for item_id in item_ids:
                pointers.set(self._item_key(item_id), response_id.encode(), px=self.ttl_ms)
            await self._call(pointers.execute())

    async def get_item(self, item_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        response_id = _text(await self._call(self._r.get(self._item_key(item_id))))
        if response_id is None:
            return None
        record = await self.get(response_id, owner=owner)
        return find_item(record, item_id) if record is not None else None

    async def _unindex(self, response_id: str) -> None:
        """Drop the item pointers that lead to this response (not those a later one took)."""
        record = await self.get(response_id)
        if record is None:
            return
        keys = [self._item_key(i) for i in record_item_ids(record.response, record.input_items)]
        if not keys:
            return
        reads = self._r.pipeline(transaction=False)  # one slot per key: no MGET
        for key in keys:
            reads.get(key)
        pointers = await self._call(reads.execute())
        mine = [k for k, v in zip(keys, pointers, strict=True) if _text(v) == response_id]
        if mine:
            pipe = self._r.pipeline(transaction=False)
            for key in mine:
                pipe.delete(key)
            await self._call(pipe.execute())

    def _item_key(self, item_id: str) -> str:
        return f"{self.prefix}item:{{{item_id}}}"

    async def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
        rkey, lkey, _ = self._record_keys(response_id)
        pipe = self._r.pipeline(transaction=True)
        # Older records also hold "names" (a tool-map snapshot nobody read): left to expire.
        pipe.hmget(rkey, ["response", "owner"])
        pipe.lrange(lkey, 0, -1)
        (response, stored_owner), items = await self._call(pipe.execute())
        record_owner = stored_owner.decode() if stored_owner else None
        if response is None or not visible(record_owner, owner):
            return None
        return StoredResponse(
            orjson.loads(response),
            [orjson.loads(item) for item in items],
            record_owner,
        )

    async def get_response(
        self, response_id: str, *, owner: str | None = None
    ) -> dict[str, Any] | None:
        rkey = self._key("resp", response_id)
        response, stored_owner = await self._call(self._r.hmget(rkey, ["response", "owner"]))
        if response is None or not visible(_text(stored_owner), owner):
            return None
        return orjson.loads(response)

    async def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        if owner is not None:
            stored_owner = await self._call(self._r.hget(self._key("resp", response_id), "owner"))
            if not visible(_text(stored_owner), owner):
                return False  # another client's: it stays, as if it did not exist
        await self._unindex(response_id)
        skey = self._key("events", response_id)
        # End the stream first, as its own command, so blocked followers are served the
        # end marker before the key disappears.
        await self._call(self._r.xadd(skey, {"e": b"1"}, nomkstream=True))
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._key("resp", response_id))
        pipe.delete(*self._record_keys(response_id)[1:], skey, self._key("cancel", response_id))
        deleted, _ = await self._call(pipe.execute())
        return bool(deleted)

    async def input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any] | None:
        check_page_args(limit, order)
        rkey, lkey, ikey = self._record_keys(response_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.exists(rkey)
        pipe.hget(rkey, "owner")
        pipe.llen(lkey)
        pipe.hget(ikey, after or "")
        exists, stored_owner, n, index = await self._call(pipe.execute())
        if not exists or not visible(_text(stored_owner), owner):
            return None
        if after is not None and index is None:
            return list_page([], False)
        # Positions in the requested order; fetch one extra to learn has_more.
        start = 0 if after is None else (n - int(index) if order == "desc" else int(index) + 1)
        stop = min(start + limit, n - 1)  # inclusive
        if start > stop:
            return list_page([], False)
        if order == "asc":
            raw = await self._call(self._r.lrange(lkey, start, stop))
        else:
            raw = await self._call(self._r.lrange(lkey, n - 1 - stop, n - 1 - start))
            raw.reverse()
        data = [orjson.loads(item) for item in raw[:limit]]
        return list_page(data, len(raw) > limit)

    def _record_keys(self, response_id: str) -> tuple[str, str, str]:
        return (
            self._key("resp", response_id),
            self._key("items", response_id),
            self._key("itemidx", response_id),
        )

    # -- background event streams ----------------------------------------------------------

    async def append_event(self, response_id: str, seq: int, data: bytes) -> None:
        if seq < 0:
            raise ValueError("seq must be >= 0")
        skey = self._key("events", response_id)
        terminal = is_terminal(data)
        fields: dict[FieldT, EncodableT] = {"d": data, "t": b"1"} if terminal else {"d": data}
        pipe = self._r.pipeline(transaction=True)
        # The seq is the entry id, so replay-after-N is a plain XREAD from 0-(N+1) and
        # Redis itself rejects duplicate or out-of-order seqs and appends after the end.
        pipe.xadd(skey, fields, id=f"0-{seq + 1}")
        if terminal:
            pipe.xadd(skey, {"e": b"1"})
        for key in (skey, *self._record_keys(response_id)):
            pipe.pexpire(key, self.ttl_ms)
        results = await self._call(pipe.execute(raise_on_error=False))
        added = results[0]
        if isinstance(added, ResponseError) and "equal or smaller" not in str(added):
            raise StoreUnavailable(f"redis store error: {added}")

    async def events(
        self, response_id: str, *, after: int = -1
    ) -> AsyncIterator[tuple[int, bytes]]:
        skey = self._key("events", response_id)
        if not await self._call(self._r.exists(skey, self._key("resp", response_id))):
            return
        cursor: bytes | str = f"0-{max(after, -1) + 1}"
        while True:
            # RESP2, undecoded: a list of [stream, entries]; redis-py's type is a wider union.
            reply: Any = await self._call(
                self._rb.xread({skey: cursor}, count=512, block=self._block_ms),
                self._block_deadline,
            )
            if not reply:
                # Quiet for a whole block: stop only if the response is gone altogether.
                gone = not await self._call(self._r.exists(skey, self._key("resp", response_id)))
                if gone:
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

    async def end_events(self, response_id: str) -> None:
        skey = self._key("events", response_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.xadd(skey, {"e": b"1"})
        pipe.pexpire(skey, self.ttl_ms)
        await self._call(pipe.execute())

    # -- cancellation ----------------------------------------------------------------------

    async def request_cancel(self, response_id: str) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._key("cancel", response_id), b"1", px=self.ttl_ms)
        pipe.publish(self._channel, response_id.encode())
        await self._call(pipe.execute())
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
            if not self._waiters:
                return  # nobody to serve; the next wait_cancel starts a new listener
            await asyncio.sleep(1.0)  # back off before resubscribing

    async def _recheck_flags(self) -> None:
        """After (re)subscribing, cancels published while unsubscribed are only in the flags."""
        ids = list(self._waiters)
        if not ids:
            return
        flags = await self._call(self._r.mget([self._key("cancel", i) for i in ids]))
        for response_id, flag in zip(ids, flags, strict=True):
            if flag is not None:
                self._wake(response_id)

    async def ping(self) -> bool:
        try:
            return bool(await self._call(self._r.ping()))
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        await self._r.aclose()
        await self._rb.aclose()


def _text(value: bytes | str | None) -> str | None:
    """A field read back (bytes, as the client does not decode), as text; None if unset."""
    if isinstance(value, bytes):
        return value.decode() or None
    return value or None
