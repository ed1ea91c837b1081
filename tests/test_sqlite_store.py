"""The SQLite store's own rules (the shared contract is in tests/test_store.py): it keeps
what it holds across a restart, one process per file, bounded by TTL and by bytes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import ManualClock

from streamer.store import StoredResponse, open_store
from streamer.store.sqlite_store import SqliteStore


def record(response_id: str, text: str = "x", **response: Any) -> StoredResponse:
    body = {"id": response_id, "object": "response", "status": "completed", "output": []}
    items = [{"type": "message", "role": "user", "content": text}]
    return StoredResponse({**body, **response}, items, "alice", "chain:first")


def completed(seq: int) -> bytes:
    return orjson.dumps({"type": "response.completed", "sequence_number": seq})


async def test_a_restart_finds_the_records_logs_and_state_key(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.db")
    store = open_store(f"sqlite:{path}")
    await store.put(record("resp_1", "first"))
    await store.append_event("resp_1", 0, b'{"type":"response.queued"}')
    await store.append_event("resp_1", 1, completed(1))
    key = await store.shared_secret("state-key", b"k" * 44)
    await store.close()

    again = open_store(f"sqlite:{path}")
    try:
        got = await again.get("resp_1", owner="alice")
        assert got is not None
        assert got.input_items[0]["content"] == "first" and got.affinity == "chain:first"
        assert await again.get("resp_1", owner="bob") is None  # owners kept too
        assert [seq async for seq, _ in again.events("resp_1")] == [0, 1]
        assert await again.shared_secret("state-key", b"other" * 9) == key
    finally:
        await again.close()


def test_a_second_process_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.db")
    store = SqliteStore(path)
    try:
        code = f"from streamer.store import open_store; open_store('sqlite:{path}')"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        assert "in use by another process" in done.stderr
        assert "Traceback" in done.stderr  # a ValueError; `serve` turns it into its message
    finally:
        asyncio.run(store.close())
    SqliteStore(path)  # free again once closed


async def test_records_expire_by_the_wall_clock(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    store = SqliteStore(str(tmp_path / "ttl.db"), ttl_seconds=10, clock=clock)
    try:
        await store.put(record("resp_old"))
        clock.advance(5)
        await store.append_event("resp_old", 0, b'{"type":"response.queued"}')  # refreshes
        clock.advance(9)
        assert await store.get("resp_old") is not None
        clock.advance(2)
        assert await store.get("resp_old") is None
        assert [pair async for pair in store.events("resp_old")] == []
        await store.put(record("resp_new"))  # a write sweeps the expired rows away
        assert store._db._scalar("SELECT count(*) FROM records") == 1
    finally:
        await store.close()


async def test_the_byte_bound_drops_the_oldest_and_ends_their_followers(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "bound.db"), max_bytes=20_000)
    try:
        await store.put(record("resp_0", "a" * 3000, status="in_progress"))
        follower = asyncio.create_task(asyncio.wait_for(_collect(store, "resp_0"), timeout=10))
        async with asyncio.timeout(10):
            while store._waiting < 1:
                await asyncio.sleep(0.005)  # polling a real condition
        for i in range(1, 12):
            await store.put(record(f"resp_{i}", "a" * 3000))
        assert await follower == []  # dropped: its follower ended
        assert await store.get("resp_0") is None
        assert await store.get("resp_11") is not None
        assert store._db.bytes <= 20_000
        kept = store._db._scalar("SELECT coalesce(sum(size), 0) FROM records")
        assert kept == store._db.bytes
    finally:
        await store.close()


async def _collect(store: SqliteStore, response_id: str) -> list[int]:
    return [seq async for seq, _ in store.events(response_id)]


def test_a_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be opened"):
        SqliteStore(str(tmp_path / "no" / "such" / "dir.db"))
    with pytest.raises(ValueError, match="needs the database file"):
        open_store("sqlite:")
