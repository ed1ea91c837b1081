"""The tool-map cache (core/tool_templates.py) against converting every time."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from streamer.core import tool_templates, tools
from streamer.core.errors import RequestError
from streamer.core.tools import NamingConfig, ResponsesToolNames

PARAMS = {"type": "object", "properties": {"q": {"type": "string"}}}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [{"type": "function", "name": "fetch", "parameters": PARAMS}],
    },
    {"type": "function", "name": "shell", "parameters": PARAMS},
    {"type": "custom", "name": "apply_patch"},
]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools, "_TEMPLATES", tool_templates.ToolTemplates())


def built(tool_list: Any, items: Any = (), config: NamingConfig = tools.DEFAULT_CONFIG) -> Any:
    return ResponsesToolNames._build(tool_list, items, config)


@pytest.mark.parametrize("style", ["codex", "double-underscore", "llamacpp", "dotted"])
def test_a_cached_map_equals_a_fresh_conversion(style: str) -> None:
    config = NamingConfig(style=style)  # type: ignore[arg-type]
    first = ResponsesToolNames.convert(copy.deepcopy(TOOLS), config=config)
    again = ResponsesToolNames.convert(copy.deepcopy(TOOLS), config=config)
    assert len(tools._TEMPLATES) == 1
    assert first == again == built(TOOLS, config=config)
    assert again.decode(again.encode("mcp__docs", "fetch")).namespace == "mcp__docs"


def test_names_registered_by_one_request_stay_in_it() -> None:
    first = ResponsesToolNames.convert(TOOLS)
    flat = first.encode("mcp__other", "thing")  # a replayed call to an undeclared tool
    assert first.decode(flat).namespace == "mcp__other"
    again = ResponsesToolNames.convert(TOOLS)
    assert again.decode(flat).namespace is None  # not known to the next request
    assert again == built(TOOLS)


def test_each_config_has_its_own_entry() -> None:
    a = ResponsesToolNames.convert(TOOLS, config=NamingConfig(style="codex"))
    b = ResponsesToolNames.convert(TOOLS, config=NamingConfig(style="dotted"))
    assert len(tools._TEMPLATES) == 2
    assert a.encode("mcp__docs", "fetch") != b.encode("mcp__docs", "fetch")


def test_tools_declared_by_input_items_are_never_cached() -> None:
    items = [{"type": "additional_tools", "tools": [{"type": "function", "name": "late"}]}]
    names = ResponsesToolNames.convert(TOOLS, items)
    assert len(tools._TEMPLATES) == 0
    assert names == built(TOOLS, items)
    assert names.encode(None, "late") == "late"


def test_an_invalid_tools_list_is_refused_every_time_and_not_cached() -> None:
    bad = [{"type": "function"}]  # no name
    for _ in range(2):
        with pytest.raises(RequestError):
            ResponsesToolNames.convert(bad)
    assert len(tools._TEMPLATES) == 0


def test_the_cache_is_bounded_in_entries_and_key_size() -> None:
    for i in range(tool_templates.MAX_ENTRIES + 10):
        ResponsesToolNames.convert([{"type": "function", "name": f"tool_{i}"}])
    assert len(tools._TEMPLATES) == tool_templates.MAX_ENTRIES
    huge = [{"type": "function", "name": "big", "description": "x" * tool_templates.MAX_KEY_BYTES}]
    assert tool_templates.ToolTemplates.key(huge, (), tools.DEFAULT_CONFIG) is None
    assert ResponsesToolNames.convert(huge) == built(huge)


def test_the_least_recently_used_list_goes_first() -> None:
    cache: tool_templates.ToolTemplates[int] = tool_templates.ToolTemplates()
    keys = [(None, bytes([i])) for i in range(tool_templates.MAX_ENTRIES)]
    for i, key in enumerate(keys):
        cache.put(key, i)
    assert cache.get(keys[0]) == 0  # used: now the newest
    cache.put((None, b"new"), -1)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) == 0
