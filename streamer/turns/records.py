"""What the store keeps of a finished turn (`stored`), built the same for every transport."""

from __future__ import annotations

from typing import Any

import orjson

from streamer.core.events import TERMINAL_EVENT_TYPES, Event
from streamer.store import StoredResponse, with_item_ids
from streamer.turns.turn import Turn


def stored(turn: Turn) -> StoredResponse:
    """What the store keeps of a turn: the public response, the input as listed (each item
    with its id: a fresh one where it has none), who asked (the owner), and the affinity
    key it was routed by (streamer/turns/registry.py). A turn that continues a stored
    response it took from the kept turn (`Turn.stored_base`) reuses that record's items as
    they are, and says so (`extends`)."""
    base, items = turn.stored_base, turn.items
    owner, affinity = turn.client or None, getattr(turn.route, "key", None)
    if base is None:
        public = with_item_ids(list(map(public_input_item, items)))
        return StoredResponse(turn.response, public, owner, affinity)
    n = base[1]
    kept = items[:n]
    kept += with_item_ids(list(map(public_input_item, items[n:])))
    return StoredResponse(turn.response, kept, owner, affinity, extends=base)


def unstored(batch: list[Event]) -> list[Event]:
    """The last batch of a turn whose response could not be stored: its terminal event's
    response says `store: false` (as `turn.response` now does). Only on that failure: the
    event is encoded again."""
    out = []
    for event in batch:
        if event.type in TERMINAL_EVENT_TYPES:
            value = orjson.loads(event.data)
            if isinstance(value.get("response"), dict):
                value["response"]["store"] = False
                event = event._replace(data=orjson.dumps(value))
        out.append(event)
    return out


def public_input_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as `input_items` lists it: message text as a list of content parts.

    Still a valid input item, so a continuation replays it unchanged.
    """
    content = item.get("content")
    if item.get("type") != "message" or not isinstance(content, str):
        return item
    kind = "output_text" if item.get("role") == "assistant" else "input_text"
    part: dict[str, Any] = {"type": kind, "text": content}
    if kind == "output_text":
        part["annotations"] = []
    return {**item, "content": [part]}
