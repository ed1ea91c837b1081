"""Stored responses: one interface, an in-memory store (the default) and a Redis store."""

from __future__ import annotations

from typing import Any

from streamer.store.base import (
    TERMINAL_EVENT_TYPES,
    ResponseStore,
    StoredResponse,
    StoreUnavailable,
    is_terminal,
    with_item_ids,
)
from streamer.store.memory import MemoryStore

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "MemoryStore",
    "ResponseStore",
    "StoreUnavailable",
    "StoredResponse",
    "is_terminal",
    "open_store",
    "with_item_ids",
]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_store(spec: str | None, *, timeout: float | None = None, **options: Any) -> ResponseStore:
    """`None`/`"memory"` -> MemoryStore, `redis://host:port/db` -> RedisStore.

    `options` go to the store's constructor (e.g. `ttl_seconds`, `key_prefix`). `timeout`
    (`--store-timeout`) bounds each operation of a networked store, so a stalled server is
    an error (`StoreUnavailable`) rather than a wait; the memory store has none to bound.
    """
    if spec is None or spec in ("memory", "memory://"):
        return MemoryStore(**options)
    if timeout is not None:
        # Connecting gets at most a second: a refused or unroutable host should fail fast.
        options = {"op_timeout": timeout, "connect_timeout": min(timeout, 1.0), **options}
    if spec.startswith(_REDIS_SCHEMES):
        try:
            from streamer.store.redis_store import (
                RedisStore,  # lazy: the package works without redis
            )
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                "the Redis store needs the redis package: pip install 'streamer-gateway[redis]'"
            ) from exc
        return RedisStore(spec, **options)
    raise ValueError(f"unknown store {spec!r}: use 'memory' or redis://host:port/db")
