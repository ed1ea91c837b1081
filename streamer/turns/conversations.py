"""Conversations on the response store: the objects, their items, and `conversation` on create.

A conversation is stored as a record like a response's (`StoredResponse`): the Conversation
object in place of the Response, its items as the input items. So it lives in the memory
store or in Redis with the same TTL (refreshed by every write), owner, byte bound and item
index (`item_reference` finds its items too), and its items page like `input_items`.

A conversation holds at most `--max-input-items` items (they become the next turn's input):
adding beyond is a 400. Appends are read, extend, write: two turns ending at once on one
conversation may lose one's items (as with any last-writer-wins store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamer.core.errors import RequestError, invalid, store_unavailable
from streamer.core.input_items import normalize_input
from streamer.core.request_checks import check_metadata as check_metadata_bounds
from streamer.core.response import new_id
from streamer.store import ResponseStore, StoredResponse, StoreUnavailable, with_item_ids
from streamer.turns.records import public_input_item

log = logging.getLogger("streamer.conversations")

PREFIX = "conv"
OBJECT = "conversation"


def not_found(conversation_id: str, param: str = "conversation_id") -> RequestError:
    return RequestError(
        f"Conversation with id '{conversation_id}' not found.",
        status=404,
        param=param,
        code="not_found",
    )


def is_conversation_id(value: str) -> bool:
    return value.startswith(PREFIX + "_")


def requested_id(value: Any) -> str | None:
    """`conversation` on create: an id, or `{"id": …}` (400 for anything else)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("id")
        if not isinstance(value, str) or not value:
            raise invalid("Missing required parameter: 'conversation.id'.", "conversation.id")
    if not isinstance(value, str) or not value:
        raise invalid("Invalid 'conversation': expected a conversation id.", "conversation")
    return value


def new_items(value: Any, param: str) -> list[dict[str, Any]]:
    """Items to add, validated as input items, each with an id (as listed from then on)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"Invalid type for '{param}': expected an array of items.", param)
    try:
        items = normalize_input(value)
    except RequestError as exc:  # its param names `input[i]`: say `items[i]`
        if exc.param and exc.param.startswith("input"):
            exc.param = param + exc.param.removeprefix("input")
        raise
    return with_item_ids([public_input_item(item) for item in items])


def check_metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid("Invalid 'metadata': expected an object of strings.", "metadata")
    check_metadata_bounds(value)  # a Response's bounds: 16 pairs, 64-character keys, 512 values
    return value


class Conversations:
    """Conversation records in a response store, as one client sees them."""

    def __init__(self, store: ResponseStore, max_items: int) -> None:
        self.store = store
        self.max_items = max_items

    async def get(self, conversation_id: str, owner: str | None) -> StoredResponse | None:
        if not is_conversation_id(conversation_id):
            return None
        try:
            record = await self.store.get(conversation_id, owner=owner)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None
        if record is None or record.response.get("object") != OBJECT:
            return None
        return record

    async def require(self, conversation_id: str, owner: str | None) -> StoredResponse:
        record = await self.get(conversation_id, owner)
        if record is None:
            raise not_found(conversation_id)
        return record

    async def create(
        self, metadata: dict[str, str], items: list[dict[str, Any]], owner: str | None
    ) -> StoredResponse:
        self._check_size(len(items), "items")
        conversation = {
            "id": new_id(PREFIX),
            "object": OBJECT,
            "created_at": int(time.time()),
            "metadata": metadata,
        }
        record = StoredResponse(conversation, items, owner or None)
        await self.put(record)
        return record

    async def put(self, record: StoredResponse) -> None:
        try:
            await self.store.put(record)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None

    async def append(self, record: StoredResponse, items: Sequence[dict[str, Any]]) -> None:
        self._check_size(len(record.input_items) + len(items), "items")
        record.input_items = [*record.input_items, *items]
        await self.put(record)

    def _check_size(self, n: int, param: str) -> None:
        if n > self.max_items:
            raise invalid(
                f"A conversation holds at most {self.max_items} items (this would make {n}).",
                param,
            )

    async def after_turn(
        self,
        conversation_id: str,
        owner: str | None,
        added: Sequence[dict[str, Any]],
        output: Sequence[dict[str, Any]],
    ) -> None:
        """A turn on the conversation ended: its new input, then its output, join it (the
        client already has its answer: a failure is logged, not raised)."""
        items = with_item_ids([public_input_item(dict(item)) for item in added])
        items += [dict(item) for item in output]
        try:
            record = await self.get(conversation_id, owner)
            if record is None:  # deleted meanwhile
                return
            record.input_items = [*record.input_items, *items]
            await self.put(record)
        except RequestError as exc:
            log.warning("could not extend conversation %s: %s", conversation_id, exc.message)
