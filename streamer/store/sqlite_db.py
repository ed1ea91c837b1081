"""The SQLite store's database: plain synchronous calls on one connection, which only the
store's own thread makes (streamer/store/sqlite_store.py). Writes run in batches, one
transaction (one commit) for all the writes that came in meanwhile (`write_batch`): a commit
costs far more than a row, and under load many turns end at once.

Tables: `records` (one row per response: the response and its input items as orjson, owner,
affinity, expiry and size), `items` (item id -> the record that last held it, for
item_reference), `events` and `logs` (a background response's event log and its end),
`secrets` (the state key) and `probe` (readiness). One row holds a whole record, written in
one statement: a record is whole or absent. Expiry is wall-clock time (it outlives the
process); expired rows are never read and are deleted as writes go on.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from streamer.store.base import StoredResponse, record_item_ids, with_item_ids

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY, response BLOB NOT NULL, items BLOB NOT NULL,
    owner TEXT, affinity TEXT, expires REAL NOT NULL, size INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS records_by_expiry ON records (expires);
CREATE TABLE IF NOT EXISTS items (item TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_record ON items (record);
CREATE TABLE IF NOT EXISTS logs (
    id TEXT PRIMARY KEY, last INTEGER NOT NULL, done INTEGER NOT NULL,
    expires REAL NOT NULL, size INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS logs_by_expiry ON logs (expires);
CREATE TABLE IF NOT EXISTS events (
    id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS probe (one INTEGER PRIMARY KEY, at REAL NOT NULL);
"""
_EVENT_OVERHEAD = 64  # a row's key and bookkeeping, roughly (as the memory store counts)
_RECORD_OVERHEAD = 256
_SWEEP = 256  # expired or evicted rows dropped per write at most


class Database:
    """Every store operation as one synchronous call; `Database.open` makes the file."""

    def __init__(
        self, conn: sqlite3.Connection, ttl: float, max_bytes: int, clock: Callable[[], float]
    ) -> None:
        self.conn = conn
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.clock = clock
        self._kept = ""  # the response written last: the byte bound never drops it
        self.bytes = self._measure()

    @classmethod
    def open(
        cls, path: str, ttl: float, max_bytes: int, clock: Callable[[], float] = time.time
    ) -> Database:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash of the process loses nothing
        conn.executescript(SCHEMA)
        return cls(conn, ttl, max_bytes, clock)

    def _scalar(self, sql: str, args: Sequence[Any] = ()) -> int:
        row = self.conn.execute(sql, args).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def write_batch(
        self, writes: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]
    ) -> list[Any]:
        """Run `writes` (calls of the write methods below) in one transaction; each one's
        result, or the exception it raised (a batch that fails as a whole is run again one
        write at a time, so one bad write fails alone); then drop what expired or is over
        the byte bound (its ids are the last result)."""
        try:
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
                results = [call(*args) for call, args in writes]
                results.append(self._sweep())
            return results
        except Exception:
            self.bytes = self._measure()  # what the rolled-back writes had counted
            if len(writes) == 1:
                raise
        return [self._alone(call, args) for call, args in writes] + [[]]

    def _alone(self, call: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            return self.write_batch([(call, args)])[0]
        except Exception as exc:
            return exc

    def _measure(self) -> int:
        records = self._scalar("SELECT coalesce(sum(size), 0) FROM records")
        return records + self._scalar("SELECT coalesce(sum(size), 0) FROM logs")

    # -- records (the writes run inside `write_batch`) ---------------------------------------

    def put(self, record: StoredResponse) -> None:
        """Write the record whole."""
        items = with_item_ids(record.input_items)
        response, listed = orjson.dumps(record.response), orjson.dumps(items)
        owner, affinity = record.owner or None, record.affinity or None
        size = _RECORD_OVERHEAD + len(response) + len(listed) + len(owner or "")
        ids = record_item_ids(record.response, items)
        size += sum(len(i) + _RECORD_OVERHEAD for i in ids)
        expires = self.clock() + self.ttl
        old = self._scalar("SELECT size FROM records WHERE id = ?", (record.id,))
        self.conn.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.id, response, listed, owner, affinity, expires, size),
        )
        if old:  # a record written again (a background turn's): its items as they are now
            self.conn.execute("DELETE FROM items WHERE record = ?", (record.id,))
        self.conn.executemany(
            "INSERT OR REPLACE INTO items VALUES (?, ?)", [(i, record.id) for i in ids]
        )
        self.conn.execute("UPDATE logs SET expires = ? WHERE id = ?", (expires, record.id))
        self.bytes += size - old
        self._kept = record.id

    def get(self, response_id: str) -> StoredResponse | None:
        row = self.conn.execute(
            "SELECT response, items, owner, affinity FROM records WHERE id = ? AND expires > ?",
            (response_id, self.clock()),
        ).fetchone()
        if row is None:
            return None
        return StoredResponse(orjson.loads(row[0]), orjson.loads(row[1]), row[2], row[3])

    def get_response(self, response_id: str) -> tuple[dict[str, Any], str | None] | None:
        row = self.conn.execute(
            "SELECT response, owner FROM records WHERE id = ? AND expires > ?",
            (response_id, self.clock()),
        ).fetchone()
        return (orjson.loads(row[0]), row[1]) if row is not None else None

    def items_of(self, response_id: str) -> tuple[list[dict[str, Any]], str | None] | None:
        row = self.conn.execute(
            "SELECT items, owner FROM records WHERE id = ? AND expires > ?",
            (response_id, self.clock()),
        ).fetchone()
        return (orjson.loads(row[0]), row[1]) if row is not None else None

    def owner_of(self, response_id: str) -> tuple[bool, str | None]:
        """(whether a live record or log exists, the record's owner)."""
        now = self.clock()
        row = self.conn.execute(
            "SELECT owner FROM records WHERE id = ? AND expires > ?", (response_id, now)
        ).fetchone()
        if row is not None:
            return True, row[0]
        return self._log(response_id, now) is not None, None

    def record_of_item(self, item_id: str) -> str | None:
        row = self.conn.execute("SELECT record FROM items WHERE item = ?", (item_id,)).fetchone()
        return str(row[0]) if row is not None else None

    def delete(self, response_id: str) -> bool:
        """Forget the record and its log; whether a live record was there."""
        existed = self.get_response(response_id) is not None
        self._drop([response_id])
        return existed

    # -- event logs ------------------------------------------------------------------------

    def append(self, response_id: str, seq: int, data: bytes, terminal: bool) -> bool:
        """Log one event; False when it is ignored (seq not above the last, or ended)."""
        now = self.clock()
        log = self._log(response_id, now)
        if log is not None and (log[1] or seq <= log[0]):
            return False
        expires = now + self.ttl
        size = len(data) + _EVENT_OVERHEAD
        self.conn.execute("INSERT OR REPLACE INTO events VALUES (?, ?, ?)",
                          (response_id, seq, data))  # fmt: skip
        self.conn.execute(
            "INSERT INTO logs VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "last = excluded.last, done = excluded.done, expires = excluded.expires, "
            "size = size + excluded.size",
            (response_id, seq, int(terminal), expires, size),
        )
        self.conn.execute("UPDATE records SET expires = ? WHERE id = ?", (expires, response_id))
        self.bytes += size
        self._kept = response_id
        return True

    def end(self, response_id: str) -> None:
        now = self.clock()
        if self._log(response_id, now) is None:
            if self.get_response(response_id) is None:
                return
            self.conn.execute("INSERT INTO logs VALUES (?, -1, 1, ?, ?)",
                              (response_id, now + self.ttl, _EVENT_OVERHEAD))  # fmt: skip
        self.conn.execute("UPDATE logs SET done = 1 WHERE id = ?", (response_id,))

    def read(self, response_id: str, after: int, limit: int = 512) -> tuple[list[Any], bool, bool]:
        """Events after `after` (at most `limit`), whether the log ended, and whether the
        response (a record or a log) still exists."""
        now = self.clock()
        log = self._log(response_id, now)
        rows = self.conn.execute(
            "SELECT seq, data FROM events WHERE id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (response_id, after, limit),
        ).fetchall()
        if log is None:
            exists = self.get_response(response_id) is not None
            return [], False, exists
        return rows, bool(log[1]) and len(rows) < limit, True

    def _log(self, response_id: str, now: float) -> tuple[int, int] | None:
        row = self.conn.execute(
            "SELECT last, done FROM logs WHERE id = ? AND expires > ?", (response_id, now)
        ).fetchone()
        return (int(row[0]), int(row[1])) if row is not None else None

    # -- the rest --------------------------------------------------------------------------

    def secret(self, name: str, candidate: bytes) -> bytes:
        self.conn.execute("INSERT OR IGNORE INTO secrets VALUES (?, ?)", (name, candidate))
        row = self.conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
        return bytes(row[0])

    def probe(self) -> None:
        self.conn.execute("INSERT OR REPLACE INTO probe VALUES (1, ?)", (self.clock(),))

    def _sweep(self) -> list[str]:
        """Drop expired responses, then the soonest to expire while over `max_bytes` (never
        the one written last); their ids (their followers end)."""
        keep, now = self._kept, self.clock()
        gone = [
            str(row[0])
            for row in self.conn.execute(
                "SELECT id FROM records WHERE expires <= ? UNION "
                "SELECT id FROM logs WHERE expires <= ? LIMIT ?",
                (now, now, _SWEEP),
            )
        ]
        self._drop(gone)
        while self.bytes > self.max_bytes:
            rows = self.conn.execute(
                "SELECT id FROM records WHERE id != ? ORDER BY expires LIMIT 16", (keep,)
            ).fetchall()
            if not rows:
                break
            batch = [str(row[0]) for row in rows]
            self._drop(batch)
            gone += batch
        return gone

    def _drop(self, ids: Sequence[str]) -> None:
        for response_id in ids:
            size = self._scalar("SELECT size FROM records WHERE id = ?", (response_id,))
            size += self._scalar("SELECT size FROM logs WHERE id = ?", (response_id,))
            self.bytes -= size
            for table, column in (("records", "id"), ("items", "record"), ("logs", "id"),
                                  ("events", "id")):  # fmt: skip
                self.conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (response_id,))

    def close(self) -> None:
        self.conn.close()
