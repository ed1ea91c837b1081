"""Stored responses: one interface; an in-memory store (the default), a SQLite file and Redis
(one server, a Cluster, Sentinel)."""

from __future__ import annotations

from typing import Any

from streamer.store.base import (
    IncompleteRecord,
    ResponseStore,
    StoredResponse,
    StoreUnavailable,
    is_terminal,
    with_item_ids,
)
from streamer.store.memory import MemoryStore

__all__ = [
    "IncompleteRecord",
    "MemoryStore",
    "ResponseStore",
    "StoreUnavailable",
    "StoredResponse",
    "is_terminal",
    "open_store",
    "with_item_ids",
]

_REDIS_ONLY = frozenset({"key_prefix", "tls", "connect_timeout", "block_seconds"})


def open_store(spec: str | None, *, timeout: float | None = None, **options: Any) -> ResponseStore:
    """`None`/`"memory"` -> MemoryStore, `sqlite:PATH` -> SqliteStore, a Redis URL
    (streamer/store/redis_connect.py: one server, a Cluster, Sentinel) -> RedisStore.

    `options` go to the store's constructor (e.g. `ttl_seconds`, `key_prefix`, `tls`).
    `timeout` (`--store-timeout`) bounds each operation of a store that can stall, so a
    stalled server is an error (`StoreUnavailable`) rather than a wait.
    """
    local = {k: v for k, v in options.items() if k not in _REDIS_ONLY}
    if spec is None or spec in ("memory", "memory://"):
        return MemoryStore(**local)
    if spec.startswith("sqlite:"):
        from streamer.store.sqlite_store import SqliteStore

        path = spec.removeprefix("sqlite:")
        if not path:
            raise ValueError("--store sqlite:PATH needs the database file's path")
        if timeout is not None:
            local["op_timeout"] = timeout
        return SqliteStore(path, **local)
    options.pop("max_bytes", None)  # Redis is bounded by its own maxmemory
    if timeout is not None:
        # Connecting gets at most a second: a refused or unroutable host should fail fast.
        options = {"op_timeout": timeout, "connect_timeout": min(timeout, 1.0), **options}
    try:
        from streamer.store.redis_connect import ALL_SCHEMES, FORMS
        from streamer.store.redis_store import RedisStore  # lazy: works without redis
    except ImportError as exc:  # pragma: no cover - depends on the environment
        if spec.startswith(("redis", "unix://")):
            raise RuntimeError(
                "the Redis store needs the redis package: pip install 'streamer-gateway[redis]'"
            ) from exc
        raise ValueError(f"unknown store {spec!r}: use memory or sqlite:PATH") from None
    if spec.startswith(ALL_SCHEMES):
        return RedisStore(spec, **options)
    raise ValueError(f"unknown store {spec!r}: use memory, sqlite:PATH or a Redis URL ({FORMS})")


def check_spec(spec: str | None, key_prefix: str = "streamer:") -> None:
    """A ValueError for a `--store` that cannot be opened as written (before serving:
    nothing is connected; a SQLite file already in use by another process is named)."""
    if spec is None or spec in ("memory", "memory://"):
        return
    if spec.startswith("sqlite:"):
        from streamer.store.sqlite_store import check_free

        check_free(spec.removeprefix("sqlite:"))
        return
    from streamer.store.redis_connect import ALL_SCHEMES, FORMS, parse

    if not spec.startswith(ALL_SCHEMES):
        raise ValueError(
            f"unknown store {spec!r}: use memory, sqlite:PATH or a Redis URL ({FORMS})"
        )
    parse(spec)
    if "{" in key_prefix or "}" in key_prefix:
        raise ValueError("--store-key-prefix may not hold { or } (Redis Cluster hash tags)")
