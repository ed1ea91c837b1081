"""`item_reference` input items (pure): which items a request refers to, and the input with
each reference replaced by the item itself.

The Vercel AI SDK, with `store: true`, sends earlier assistant text and reasoning as
`{"type": "item_reference", "id": …}`. The gateway looks the ids up (the continued history,
then the store's items of stored responses) and `resolve` puts the items in their place; an
id found nowhere is a 400 whose `param` is the reference's `id`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streamer.core.errors import RequestError, invalid


def is_reference(item: Any) -> bool:
    """An item_reference: typed so, or an item with only an `id` (`type` is optional)."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return kind == "item_reference" or (kind is None and "role" not in item and "id" in item)


def referenced_ids(value: Any) -> dict[str, int]:
    """The ids an `input` refers to, each with the position of its first reference (400 for a
    reference whose id is not a non-empty string)."""
    if not isinstance(value, list):
        return {}
    ids: dict[str, int] = {}
    # the items of a replayed body's known part were looked at when it came first
    start = getattr(value, "known", 0) if not getattr(value, "references", True) else 0
    for i, item in enumerate(value[start:] if start else value, start):
        if not is_reference(item):
            continue
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise invalid(
                f"Invalid type for 'input[{i}].id': expected a non-empty string.", f"input[{i}].id"
            )
        ids.setdefault(item_id, i)
    return ids


def items_by_id(items: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Items keyed by their id (the last one of an id wins: its latest form)."""
    return {
        item["id"]: item
        for item in items
        if isinstance(item, dict) and isinstance(item.get("id"), str) and not is_reference(item)
    }


def resolve(value: list[Any], found: Mapping[str, dict[str, Any]]) -> list[Any]:
    """`input` with each reference replaced by a copy of its item; a reference whose id is not
    in `found` is a 400 naming it (`input[i].id`)."""
    out: list[Any] = []
    for i, item in enumerate(value):
        if not is_reference(item):
            out.append(item)
            continue
        target = found.get(item["id"])
        if target is None or is_reference(target):
            raise not_found(item["id"], i)
        out.append(dict(target))
    return out


def not_found(item_id: str, index: int) -> RequestError:
    return invalid(
        f"Item with id '{item_id}' not found: an item_reference must name an item of a stored "
        "response (its input or output) that this client can see.",
        f"input[{index}].id",
        "item_not_found",
    )
