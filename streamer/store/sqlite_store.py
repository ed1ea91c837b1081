"""The SQLite store (`--store sqlite:PATH`): one gateway's responses kept on disk, so they
outlive a restart without a Redis.

The database (streamer/store/sqlite_db.py, stdlib `sqlite3` in WAL mode) is used by one
thread of its own: every operation is handed to it, so the event loop never waits on the
disk. Writes queue up while the thread is busy and go in one transaction together. Followers of a background response and cancels are this process's (the memory
store's rules); a second process on the same file is refused (a lock on `PATH.lock`), as
its followers and cancels would not reach this one: several instances share a Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar

from streamer.store.base import (
    Order,
    StoredResponse,
    StoreUnavailable,
    find_item,
    is_terminal,
    page_items,
    visible,
    why,
)
from streamer.store.cancels import Cancels
from streamer.store.sqlite_db import Database

T = TypeVar("T")
MiB = 1024 * 1024


class SqliteStore:
    """A `ResponseStore` in one SQLite file, for one gateway process."""

    shared = False
    durable = True

    def __init__(
        self,
        path: str,
        ttl_seconds: float = 3600.0,
        *,
        max_bytes: int = 1024 * MiB,
        max_responses: int = 10_000,
        op_timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._lock = _lock(path)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="streamer-sqlite")
        self._op_timeout = op_timeout
        try:
            opening = self._thread.submit(Database.open, path, ttl_seconds, max_bytes, clock)
            self._db = opening.result()
        except sqlite3.Error as exc:
            self._thread.shutdown(wait=False)
            self._lock.close()
            raise ValueError(f"the SQLite store {path} cannot be opened: {exc}") from None
        self._closed = False
        self._queue: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        self._queued = threading.Lock()  # the queue is taken by the store's thread
        self._flushing = False  # a flush of the queue is on its way to the thread
        self._cancels = Cancels(max_responses, ttl_seconds, time.monotonic)
        self._changed: dict[str, asyncio.Event] = {}  # per followed log: set on each change
        self._waiting = 0  # followers waiting for a change now (tests wait on it)

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on the store's thread; a failure of the disk is StoreUnavailable."""
        future = self._thread.submit(call, *args)
        try:
            async with asyncio.timeout(self._op_timeout):
                return await asyncio.wrap_future(future)
        except (sqlite3.Error, OSError, TimeoutError, RuntimeError) as exc:
            raise StoreUnavailable(f"sqlite store unavailable: {why(exc)}") from exc

    async def _write(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` in the next batch of writes (one transaction); StoreUnavailable
        if it fails or does not come back within the operation timeout."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._queued:
            self._queue.append((call, args, future))
            start, self._flushing = not self._flushing, True
        if start:
            try:
                self._thread.submit(self._flush, asyncio.get_running_loop())
            except RuntimeError as exc:  # closed
                raise StoreUnavailable(f"sqlite store unavailable: {why(exc)}") from exc
        try:
            async with asyncio.timeout(self._op_timeout):
                return await asyncio.shield(future)  # a timed-out write may still land
        except (sqlite3.Error, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"sqlite store unavailable: {why(exc)}") from exc

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the store's thread: every queued write, in one transaction; the results go
        back to the loop in one call."""
        with self._queued:
            batch, self._queue, self._flushing = self._queue, [], False
        try:
            results = self._db.write_batch([(call, args) for call, args, _ in batch])
        except Exception as exc:
            results = [exc] * len(batch) + [[]]
        loop.call_soon_threadsafe(self._settle, batch, results)

    def _settle(self, batch: list[Any], results: list[Any]) -> None:
        for (_, _, future), result in zip(batch, results, strict=False):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        self._wake(results[-1])

    def _wake(self, ids: list[str] | tuple[str, ...]) -> None:
        for response_id in ids:
            changed = self._changed.pop(response_id, None)
            if changed is not None:
                changed.set()  # followers wait on the one they saw: no lock needed

    # -- records ---------------------------------------------------------------------------

    async def put(self, record: StoredResponse) -> None:
        await self._write(self._db.put, record)

    async def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None:
        record = await self._run(self._db.get, response_id)
        return record if record is not None and visible(record.owner, owner) else None

    async def get_response(
        self, response_id: str, *, owner: str | None = None
    ) -> dict[str, Any] | None:
        found = await self._run(self._db.get_response, response_id)
        return found[0] if found is not None and visible(found[1], owner) else None

    async def get_item(self, item_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        response_id = await self._run(self._db.record_of_item, item_id)
        record = await self.get(response_id, owner=owner) if response_id is not None else None
        return find_item(record, item_id) if record is not None else None

    async def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        exists, record_owner = await self._run(self._db.owner_of, response_id)
        if exists and not visible(record_owner, owner):
            return False  # another client's: it stays, as if it did not exist
        self._cancels.forget(response_id)
        deleted = await self._write(self._db.delete, response_id)
        self._wake([response_id])
        return deleted

    async def input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any] | None:
        found = await self._run(self._db.items_of, response_id)
        if found is None or not visible(found[1], owner):
            return None
        return page_items(found[0], limit=limit, order=order, after=after)

    # -- background event logs -------------------------------------------------------------

    async def append_event(self, response_id: str, seq: int, data: bytes) -> None:
        if seq < 0:
            raise ValueError("seq must be >= 0")
        if await self._write(self._db.append, response_id, seq, data, is_terminal(data)):
            self._wake([response_id])

    async def events(
        self, response_id: str, *, after: int = -1
    ) -> AsyncIterator[tuple[int, bytes]]:
        cursor = after
        while not self._closed:
            changed = self._changed.setdefault(response_id, asyncio.Event())
            rows, done, exists = await self._run(self._db.read, response_id, cursor)
            if not exists:
                return
            for seq, data in rows:
                cursor = seq
                yield seq, bytes(data)
            if done:
                return
            if not rows:
                self._waiting += 1
                try:
                    await changed.wait()
                finally:
                    self._waiting -= 1

    async def end_events(self, response_id: str) -> None:
        await self._write(self._db.end, response_id)
        self._wake([response_id])

    # -- cancellation ----------------------------------------------------------------------

    async def request_cancel(self, response_id: str) -> None:
        self._cancels.request(response_id)

    async def wait_cancel(self, response_id: str) -> None:
        await self._cancels.wait(response_id)

    # -- the store itself ------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            await self._write(self._db.probe)
        except StoreUnavailable:
            return False
        return True

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        return await self._write(self._db.secret, name, candidate)

    async def check(self) -> list[str]:
        return []

    async def close(self) -> None:
        # Nothing else in this process will append: let every follower finish.
        self._closed = True
        for changed in self._changed.values():
            changed.set()
        self._changed.clear()
        with contextlib.suppress(Exception):
            await self._run(self._db.close)
        self._thread.shutdown(wait=False)
        self._lock.close()


def _lock(path: str) -> IO[bytes]:
    """An exclusive lock on `PATH.lock` for this process's lifetime (a ValueError if another
    process holds it: it would not see this one's followers and cancels)."""
    try:
        handle = open(path + ".lock", "ab")  # noqa: SIM115 - held until close()
    except OSError as exc:
        raise ValueError(f"the SQLite store {path} cannot be opened: {exc.strerror}") from None
    try:
        import fcntl  # POSIX; elsewhere the file is not guarded

        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:
        return handle
    except BlockingIOError:
        handle.close()
        raise ValueError(
            f"the SQLite store {path} is in use by another process (pid in {path}.lock): "
            "one process per file; several instances or --workers share a Redis "
            "(--store redis://…)"
        ) from None
    handle.truncate(0)
    handle.write(str(os.getpid()).encode())
    handle.flush()
    return handle


def check_free(path: str) -> None:
    """A ValueError unless `path` could be opened now by this process (it is named, its
    folder exists, no other process holds it)."""
    if not path:
        raise ValueError("--store sqlite:PATH needs the database file's path")
    _lock(path).close()
