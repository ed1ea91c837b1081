"""The store as the gateway opens it at startup: its options from the settings, the store
server's own configuration checked (warnings), and the state key kept in the store.

The state key seals `encrypted_content` (streamer/core/sealing.py). Without `--state-key-file`,
a store that other instances share (Redis) or that outlives the process (SQLite) keeps
one: the first instance to start makes it (`shared_secret`, set if absent) and every other
one, and every later start, uses the same, so compaction and reasoning items open on any
instance and after restarts. The memory store keeps none: each process has its own key.
"""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import replace

from streamer.config import Settings
from streamer.store import ResponseStore, StoreUnavailable, open_store
from streamer.turns.options import store_options

log = logging.getLogger("streamer.store")

STATE_KEY = "state-key"


async def open_gateway_store(settings: Settings) -> tuple[ResponseStore, Settings, bool]:
    """The store of `--store`, checked; the settings with the store's state key; whether
    the store answered (if not, `store: true` turns are refused until it does)."""
    store = open_store(settings.store, **store_options(settings))
    try:
        for advice in await store.check():
            log.warning("store: %s", advice)
        settings = await with_state_key(settings, store)
    except StoreUnavailable as exc:
        log.warning("the store did not answer at startup: %s", exc)
        if store.shared and not settings.state_key_file:
            log.warning(
                "the state key could not be read from the store: this process seals "
                "encrypted_content with a key of its own, which other instances cannot "
                "open (restart it once the store answers, or give every instance the "
                "same --state-key-file)"
            )
        return store, settings, False
    return store, settings, True


async def with_state_key(settings: Settings, store: ResponseStore) -> Settings:
    """`settings` with the state key the store keeps (made now if it has none), unless a
    `--state-key-file` names one or the store keeps nothing across processes."""
    if settings.state_key_file or not (store.shared or store.durable):
        return settings
    # under --workers the supervisor's key is the candidate: the first worker keeps it
    candidate = settings.shared_state_key or base64.b64encode(os.urandom(32))
    secret = await store.shared_secret(STATE_KEY, candidate)
    log.info("the state key is kept in the store: sealed items open on every instance on it")
    return replace(settings, shared_state_key=secret)
