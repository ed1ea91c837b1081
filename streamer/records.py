"""What the store keeps of a finished turn (`stored`), built the same for every transport."""

from __future__ import annotations

from typing import Any

from streamer.store import StoredResponse
from streamer.turn import Turn


def stored(turn: Turn) -> StoredResponse:
    """What the store keeps of a turn: the public response, the input as listed, and who
    asked (the owner)."""
    return StoredResponse(
        turn.response, [public_input_item(item) for item in turn.items], turn.client or None
    )


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
