"""Which replica, in which order: the routing rules as pure functions over plain data.

- A turn's **affinity key**: its `prompt_cache_key`, else the chain of `previous_response_id`
  it continues (remembered per response id, bounded), else its WebSocket connection.
- With a key, replicas are ranked by **rendezvous hashing** (highest hash of key and replica
  first), so a key stays on its replica while that one is healthy, and adding or losing a
  replica moves only the keys it wins or held. Without one: least in flight first.
- Unhealthy replicas come last (still tried when nothing else is left).
- A failure before the first byte moves the turn on when it is a connect error, a 5xx or a
  429 (`retryable`); a fallback model is skipped when it lacks what the turn needs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ReplicaState:
    """What routing knows of one replica: its URL, turns in flight, health."""

    url: str
    in_flight: int = 0
    healthy: bool = True
    down_until: float = 0.0  # after a passive failure: unhealthy until then (or a good probe)

    def usable(self, now: float) -> bool:
        return self.healthy or now >= self.down_until


def score(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest())


def rank(replicas: Sequence[ReplicaState], key: str | None, now: float, turn: int = 0) -> list[int]:
    """The order to try `replicas` in (indices): usable ones first, by rendezvous score for
    a key, else fewest in flight (ties rotate with `turn`); then the unusable ones."""
    n = len(replicas)
    if key is not None:
        order = sorted(range(n), key=lambda i: -score(key, replicas[i].url))
    else:
        order = sorted(range(n), key=lambda i: (replicas[i].in_flight, (i - turn) % n))
    return [i for i in order if replicas[i].usable(now)] + [
        i for i in order if not replicas[i].usable(now)
    ]


def mark_failed(replica: ReplicaState, now: float, cooldown: float) -> None:
    replica.healthy = False
    replica.down_until = now + cooldown


def mark_ok(replica: ReplicaState) -> None:
    replica.healthy = True
    replica.down_until = 0.0


def retryable(status: int) -> bool:
    """A failure another replica may not have: unreachable (502), any 5xx, 429."""
    return status >= 500 or status == 429


@dataclass(frozen=True, slots=True)
class Needs:
    """What a turn needs of the model that serves it."""

    tools: bool = False
    images: bool = False
    reasoning: bool = False

    def missing(self, tools: bool, images: bool, reasoning: bool) -> list[str]:
        wanted = (("tools", self.tools, tools), ("images", self.images, images))
        lacks = [name for name, need, has in wanted if need and not has]
        return lacks + (["reasoning"] if self.reasoning and not reasoning else [])


def needs(request: Mapping[str, Any], backend_request: Mapping[str, Any]) -> Needs:
    """Tools (any sent to the backend), images (an image part in a message), reasoning (an
    effort other than none asked)."""
    reasoning = request.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    return Needs(
        tools=bool(backend_request.get("tools")),
        images=any(_has_image(m) for m in backend_request.get("messages") or ()),
        reasoning=effort not in (None, "none"),
    )


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return False
    return any(isinstance(p, dict) and p.get("type") == "image_url" for p in content)


class Chains:
    """The affinity key of each response of a `previous_response_id` chain, at most
    `limit` responses (least recently used forgotten first)."""

    __slots__ = ("keys", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.keys: OrderedDict[str, str] = OrderedDict()

    def key_for(
        self,
        response_id: str,
        request: Mapping[str, Any],
        session: str | None,
        inherited: str | None = None,
    ) -> str | None:
        """The turn's affinity key, remembered for the response it makes: its cache key,
        its chain's (a chain starts at its first response), its socket's; None (fewest in
        flight) only for a turn nothing can continue (`store: false`, no cache key).
        `inherited`: the continued response's key as its record kept it (the store's word,
        so a chain keeps its key on every instance; the local memory is its fallback)."""
        cache_key = request.get("prompt_cache_key")
        previous = request.get("previous_response_id")
        if isinstance(cache_key, str) and cache_key:
            key = "cache:" + cache_key
        elif isinstance(previous, str) and previous:
            key = inherited or self.keys.get(previous) or "chain:" + previous
        elif session is not None:
            key = "socket:" + session
        elif request.get("store") is False:
            return None
        else:
            key = "chain:" + response_id
        if self.limit > 0:
            self.keys[response_id] = key
            if isinstance(previous, str) and previous in self.keys:
                self.keys.move_to_end(previous, last=False)  # next out: its successor holds it
            while len(self.keys) > self.limit:
                self.keys.popitem(last=False)
        return key
