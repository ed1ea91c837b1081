"""What a Redis must be set to for the gateway, read from the server at startup (CONFIG GET,
where the server allows it) and said as warnings (docs/stores.md, "What Redis needs").

- `maxmemory-policy`: `noeviction` (a full server refuses writes: `/readyz` fails and
  `store: true` turns are refused) or a `volatile-*` policy (records, which all expire, are
  evicted whole). An `allkeys-*` policy may also evict what never expires: the shared state
  key, so sealed items made before stop opening everywhere.
- Persistence (`appendonly yes`, or RDB `save` points): without it a restart of Redis
  forgets every stored response and the state key.
- `redis://` pointed at a Cluster node: every key of another node's slots is refused
  (MOVED); `redis+cluster://` is the URL for a Cluster.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from streamer.store.base import StoreUnavailable, why
from streamer.store.redis_connect import Target

log = logging.getLogger("streamer.store")

GOOD_POLICIES = "noeviction or a volatile-* policy (volatile-lru, volatile-ttl, …)"


def advice(config: dict[str, str], where: str) -> list[str]:
    """What to change in one server's configuration (`CONFIG GET` of the keys below)."""
    found: list[str] = []
    policy = config.get("maxmemory-policy", "noeviction")
    if policy.startswith("allkeys-") and config.get("maxmemory", "0") != "0":
        found.append(
            f"Redis {where} has maxmemory-policy {policy}: when full it may evict keys that "
            "never expire, the shared state key among them (sealed items made before then "
            f"stop opening on every instance); set {GOOD_POLICIES}"
        )
    if config.get("appendonly", "no") == "no" and not config.get("save", "").strip():
        found.append(
            f"Redis {where} keeps nothing on disk (appendonly no, no save points): a restart "
            "of Redis forgets every stored response and the shared state key; set "
            "appendonly yes"
        )
    return found


async def config_advice(client: Any, target: Target, deadline: float) -> list[str]:
    """The advice for every data node of `target` ([] when CONFIG is not allowed: logged)."""
    try:
        async with asyncio.timeout(deadline):
            if target.kind == "cluster":
                await client.initialize()  # the slot map: which nodes are primaries
                found = []
                for node in client.get_primaries():
                    config = await _config(client, target_nodes=node)
                    found += advice(config, node.name)
                return found
            info = _text_dict(await client.info("cluster"))
            if info.get("cluster_enabled") in ("1", 1):
                return [
                    f"{target.shown} is a node of a Redis Cluster: other nodes' keys are "
                    "refused (MOVED); use redis+cluster://host:port,… as --store"
                ]
            return advice(await _config(client), target.shown)
    except ResponseError as exc:  # CONFIG renamed or not allowed (managed Redis)
        log.info("could not read the Redis configuration (%s): make sure maxmemory-policy "
                 "is %s and persistence is on", exc, GOOD_POLICIES)  # fmt: skip
        return []
    except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        raise StoreUnavailable(f"redis store unavailable: {why(exc)}") from exc


async def _config(client: Any, **route: Any) -> dict[str, str]:
    config: dict[str, str] = {}
    for name in ("maxmemory", "maxmemory-policy", "appendonly", "save"):
        config.update(_text_dict(await client.config_get(name, **route)))
    return config


def _text_dict(value: Any) -> dict[str, Any]:
    """A reply of CONFIG GET or INFO with its keys and values as text."""
    if not isinstance(value, dict):
        return {}
    return {_str(k): _str(v) if isinstance(v, bytes) else v for k, v in value.items()}


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
