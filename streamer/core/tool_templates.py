"""The tool maps of recent requests, by their tools list's bytes (pure, bounded).

Clients resend one tools list turn after turn. Converting it (validation, names,
hashes) is the largest part of preparing a turn for Codex's ~20 tools; its JSON is
encoded anyway to check the size budget, so that encoding is the key. Only requests
whose tools are all in `tools` are kept (input items may declare tools too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")

# Input items that declare tools: a request with one is converted as it is.
SOURCE_ITEMS = frozenset({"additional_tools", "tool_search_output"})
MAX_ENTRIES = 32  # distinct tools lists kept (a few per client at a time)
MAX_KEY_BYTES = 256 * 1024  # larger lists are converted every time: at most 8 MiB of keys


class ToolTemplates(Generic[T]):
    """Least recently used maps, at most `MAX_ENTRIES` of them, keyed by (config, JSON)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[object, bytes], T] = OrderedDict()

    @staticmethod
    def key(tools: Any, input_items: Any, config: object) -> tuple[object, bytes] | None:
        """The key of a request's tools, or None if it is not to be kept."""
        if not tools or tools.__class__ is not list:
            return None
        if input_items and not isinstance(input_items, str):
            if not isinstance(input_items, Iterable) or isinstance(input_items, bytes | Mapping):
                return None
            for item in input_items:
                is_object = item.__class__ is dict or isinstance(item, Mapping)
                if is_object and item.get("type") in SOURCE_ITEMS:
                    return None
        try:
            encoded = orjson.dumps(tools)
        except TypeError:  # integers beyond 64 bits: the plain path reports them
            return None
        return (config, encoded) if len(encoded) <= MAX_KEY_BYTES else None

    def get(self, key: tuple[object, bytes]) -> T | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[object, bytes], value: T) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
