"""What the store keeps of a finished turn (`stored`), built the same for every transport."""

from __future__ import annotations

from typing import Any

from streamer.pipeline import Turn
from streamer.store import StoredResponse, with_item_ids


def stored(turn: Turn) -> StoredResponse:
    """What the store keeps of a turn: the public response, the input as listed (each item
    with its id: a fresh one where it has none), and who asked (the owner). A turn that
    continues a stored response it took from the kept turn (`Turn.stored_base`) reuses
    that record's items as they are, and says so (`extends`)."""
    base, items = turn.stored_base, turn.items
    if base is None:
        return StoredResponse(
            turn.response, with_item_ids(list(map(public_input_item, items))), turn.client or None
        )
    n = base[1]
    kept = items[:n]
    kept += with_item_ids(list(map(public_input_item, items[n:])))
    return StoredResponse(turn.response, kept, turn.client or None, extends=base)


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
