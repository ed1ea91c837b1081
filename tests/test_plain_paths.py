"""The plain paths a long history takes against the general ones (differential).

Validation takes the plain shapes of the tool loop's items by type checks alone
(`input_items._plain`; `PLAIN_ITEMS = False`: every item through `_item`), lowering lowers
runs of them in one loop (`chat_messages._plain_run`; `PLAIN_RUNS = False`: every item
through `MessageBuilder.add`), and the tool map answers `encode` from a memo of its
answers. On random histories, plain and odd shapes mixed, each must give what the general
path gives: the same items or the same 400 (message and `param`), the same Chat request,
the same flat names registered.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from item_strategies import NAMES, NAMESPACES, TOOLS, items

from streamer.core import chat_messages, input_items
from streamer.core.errors import RequestError
from streamer.core.lowering import LoweringOptions, lower, normalize_input
from streamer.core.tools import ResponsesToolNames

OPTIONS = st.builds(
    LoweringOptions,
    replay_reasoning=st.booleans(),
    system_messages=st.sampled_from(["merge", "keep", "user"]),
    file_parts=st.booleans(),
)


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What `fn` gives: its value, or the 400 it raises (message and param)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except RequestError as exc:
        return ("400", exc.message, exc.param)


@settings(max_examples=400, deadline=None)
@given(items(), st.integers(0, 3))
def test_validation_plain_items_as_the_general_checks(history: list[Any], start: int) -> None:
    fast = outcome(normalize_input, history, start)
    with mock.patch.object(input_items, "PLAIN_ITEMS", False):
        plain = outcome(normalize_input, history, start)
    assert fast == plain


def _lowered(history: list[Any], options: LoweringOptions, runs: bool) -> Any:
    names = ResponsesToolNames.convert(TOOLS, history)
    request = {"model": "m", "instructions": "Be brief.", "tools": TOOLS}
    with mock.patch.object(chat_messages, "PLAIN_RUNS", runs):
        got = outcome(lower, request, history, names, options)
    return got, sorted(names._by_flat)


REASONED_CALL = [
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
    {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "y"},
]


@settings(max_examples=400, deadline=None)
@given(items(), OPTIONS)
@example(REASONED_CALL, LoweringOptions())
def test_lowering_plain_runs_as_item_by_item(history: list[Any], options: LoweringOptions) -> None:
    try:
        valid = normalize_input(history)
    except RequestError:
        valid = [i for i in history if outcome(normalize_input, [i])[0] == "ok"]
    assert _lowered(valid, options, True) == _lowered(valid, options, False)


def test_a_run_of_the_tool_loop_is_lowered_as_the_builder_does() -> None:
    """The shape the plain run is for, spelled out: calls before their outputs, a cut-off
    call's note, blank arguments, an assistant's text before its calls."""
    history = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "run", "namespace": "mcp__a",
         "arguments": '{"q":1}'},
        {"type": "function_call", "call_id": "c2", "name": "search", "arguments": '{"q":'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": "now"},
        {"type": "function_call", "call_id": "c3", "name": "run", "namespace": "mcp__a",
         "arguments": " "},
        {"type": "function_call_output", "call_id": "c3", "output": "three"},
    ]  # fmt: skip
    fast, _ = _lowered(history, LoweringOptions(), True)
    plain, _ = _lowered(history, LoweringOptions(), False)
    assert fast == plain
    messages = fast[1]["messages"]
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "tool",
    ]  # fmt: skip
    assert [c["function"]["name"] for c in messages[2]["tool_calls"]] == ["mcp__a__run", "search"]
    assert messages[2]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert "cut off" in messages[2]["content"]
    assert messages[5]["content"] == "now"
    assert messages[5]["tool_calls"][0]["function"]["arguments"] == "{}"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(NAMESPACES, NAMES, st.sampled_from(["function", "custom", "tool_search"])),
        max_size=30,
    )
)
def test_encode_answers_from_its_memo_what_it_would_work_out(
    calls: list[tuple[str | None, str, Any]],
) -> None:
    memo = ResponsesToolNames.convert(TOOLS)
    fresh = ResponsesToolNames.convert(TOOLS)
    for ns, name, kind in calls:
        assert memo.encode(ns, name, kind) == fresh._encode(ns, name, kind)
        assert memo.encode(ns, name, kind) == fresh._encode(ns, name, kind)  # answered again
    assert memo == fresh
    copied = memo.copy()
    for ns, name, kind in calls:
        assert copied.encode(ns, name, kind) == memo.encode(ns, name, kind)


@pytest.mark.parametrize("odd", [["a"], None, 7, {"x": 1}])
def test_encode_takes_what_is_not_a_string_as_before(odd: Any) -> None:
    names = ResponsesToolNames.convert(TOOLS)
    assert names.encode(None, odd) == ResponsesToolNames.convert(TOOLS)._encode(
        None, odd, "function"
    )
