"""A deferred top-level function (`defer_loading: true`, not in a namespace).

OpenAI calls such a function, once tool search has loaded it, with `namespace` equal to its
name; the Agents SDK routes a call to a deferred tool only in that form. The gateway offers
deferred tools to the backend at once (it cannot search), keeps the client's name as the flat
name, and gives the call back in OpenAI's form; history in either form replays to that name.
"""

from __future__ import annotations

from streamer.core.tools import ResponsesToolNames, ToolIdentity

DEFERRED = {"type": "function", "name": "orders", "defer_loading": True}


def test_deferred_top_level_function_comes_back_with_its_name_as_namespace() -> None:
    names = ResponsesToolNames.convert([DEFERRED, {"type": "function", "name": "plain"}])
    assert [t.name for t in names.tools] == ["orders", "plain"]
    assert names.decode("orders") == ToolIdentity("orders", "orders", "function")
    assert names.decode("plain") == ToolIdentity(None, "plain", "function")


def test_history_in_either_form_replays_to_the_one_flat_name() -> None:
    names = ResponsesToolNames.convert([DEFERRED])
    assert names.encode("orders", "orders") == "orders"
    assert names.encode(None, "orders") == "orders"
    assert [t.name for t in names.tools] == ["orders"]


def test_tool_choice_names_the_deferred_function_either_way() -> None:
    names = ResponsesToolNames.convert([DEFERRED])
    for choice in (
        {"type": "function", "name": "orders"},
        {"type": "function", "name": "orders", "namespace": "orders"},
    ):
        assert names.resolve_choice(choice).allowed == ("orders",)


def test_a_deferred_custom_tool_or_namespace_member_is_unchanged() -> None:
    custom = {"type": "custom", "name": "patch", "defer_loading": True}
    member = {"type": "function", "name": "find", "defer_loading": True}
    names = ResponsesToolNames.convert(
        [custom, {"type": "namespace", "name": "docs", "tools": [member]}]
    )
    assert names.decode("patch") == ToolIdentity(None, "patch", "custom")
    assert names.decode("docs__find") == ToolIdentity("docs", "find", "function")
