"""A backend's items passed whole, and its events about them (pure).

A Responses backend's hosted call (`web_search_call`, ...) is not streamed by the gateway:
it is added (`ItemAdded`), its own events (`response.web_search_call.searching`, ...) pass
through, and it is done whole (`WholeItem`). The client must see only the gateway's ids,
and every event after its item's `output_item.added`, so `PassedItems` keeps, per backend
item (its `key`), the gateway's id and output index once the gateway has added it, and
holds the events that come before.
"""

from __future__ import annotations

from typing import Any

# Where a pass-through event names its item (Responses events use these two fields).
_WHERE = ("item_id", "output_index")


class PassedItems:
    """The backend items the gateway has added, and the events held for the others."""

    __slots__ = ("_held", "_opened")

    def __init__(self) -> None:
        self._opened: dict[Any, tuple[str, int]] = {}  # backend key -> gateway id, index
        self._held: dict[Any, list[dict[str, Any]]] = {}  # events for items not added yet

    def opened(self, key: Any, item_id: str, output_index: int) -> list[dict[str, Any]]:
        """The gateway added the item `key`: the events held for it, now naming it."""
        self._opened[key] = (item_id, output_index)
        return [named(e, item_id, output_index) for e in self._held.pop(key, ())]

    def where(self, key: Any) -> tuple[str, int] | None:
        """The gateway's id and output index of the backend item `key`, once added."""
        return self._opened.get(key)

    def event(self, event: dict[str, Any], key: Any) -> dict[str, Any] | None:
        """The event as the client sees it (the gateway's item), or None: held until the
        gateway adds its item."""
        where = self._opened.get(key)
        if where is None:
            self._held.setdefault(key, []).append(event)
            return None
        return named(event, *where)

    def hold(self, event: dict[str, Any], key: Any) -> None:
        self._held.setdefault(key, []).append(event)

    def orphans(self) -> list[tuple[Any, list[dict[str, Any]]]]:
        """The events still held (their item never came), by item, and forgets them."""
        held, self._held = self._held, {}
        return list(held.items())


def named(event: dict[str, Any], item_id: str, output_index: int) -> dict[str, Any]:
    """`event` naming the gateway's item: its `item_id` and `output_index` replaced (set
    when it had them; an event that named its item by one of them gets both)."""
    out = dict(event)
    out.pop("sequence_number", None)
    out["item_id"] = item_id
    out["output_index"] = output_index
    return out


def about_item(event: dict[str, Any]) -> bool:
    """Whether an event names an item (by `item_id` or `output_index`)."""
    return any(k in event for k in _WHERE)


def item_type_of(event_type: str) -> str:
    """The item type a pass-through event's type names: `response.web_search_call.searching`
    -> `web_search_call` (for an item the backend never added)."""
    parts = event_type.split(".")
    return parts[1] if len(parts) > 2 else "item"
