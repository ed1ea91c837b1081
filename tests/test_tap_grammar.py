"""The stream grammar checker: clean streams pass, each broken stream breaks exactly one rule."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamer.core.sse import SSEDecoder
from streamer.core.tools import ResponsesToolNames
from streamer.tap.grammar import RULES, GrammarChecker, Violation

STREAMS = Path(__file__).parent / "fixtures" / "streams"
SSE_FIXTURES = [
    "text.sse",
    "reasoning.sse",
    "namespaced_call.sse",
    "parallel_calls.sse",
    "refusal.sse",
    "incomplete.sse",
    "failed.sse",
    "error.sse",
]
Events = list[Any]


def load(name: str) -> Events:
    path = STREAMS / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    decoder = SSEDecoder()
    messages = decoder.feed(path.read_bytes()) + decoder.close()
    events = [json.loads(m.data) for m in messages]
    assert all(m.event == e["type"] for m, e in zip(messages, events, strict=True))
    return events


def names() -> ResponsesToolNames:
    request = json.loads((STREAMS / "request.json").read_text())
    return ResponsesToolNames.convert(request["tools"], request["input"])


def check(events: Events, *, with_names: bool = False, session: bool = False) -> list[Violation]:
    checker = GrammarChecker(names() if with_names else None, session=session)
    found: list[Violation] = []
    for event in events:
        found += checker.feed(event)
    return found + checker.finish()


def renumber(events: Events) -> Events:
    for i, event in enumerate(events):
        if isinstance(event, dict) and "sequence_number" in event:
            event["sequence_number"] = i
    return events


def rules(found: list[Violation]) -> list[tuple[str, int]]:
    return [(v.rule, v.position) for v in found]


# -- clean streams ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SSE_FIXTURES)
@pytest.mark.parametrize("with_names", [False, True])
def test_clean_sse_streams_have_no_violations(name: str, with_names: bool) -> None:
    events = load(name)
    assert events[0]["type"] == "response.created"
    assert check(events, with_names=with_names) == []


def test_clean_websocket_session_with_two_turns_and_a_vendor_frame() -> None:
    events = load("ws_session.jsonl")
    assert [e["type"] for e in events].count("response.created") == 2
    assert check(events, session=True, with_names=True) == []
    # read as a single stream, everything after the first terminal is trailing
    single = rules(check(events))
    first_end = next(i for i, e in enumerate(events) if e["type"] == "response.completed")
    assert single == [("terminal.trailing", i) for i in range(first_end + 1, len(events))]


def test_every_rule_has_a_description() -> None:
    assert all(rule.count(".") <= 1 and text for rule, text in RULES.items())


@pytest.mark.parametrize("name", ["text.sse", "parallel_calls.sse", "reasoning.sse"])
def test_any_truncation_is_a_missing_terminal_at_the_cut(name: str) -> None:
    events = load(name)
    for cut in range(len(events)):
        assert rules(check(events[:cut])) == [("terminal.missing", cut)]


# -- broken streams: each mutation breaks exactly one rule ------------------------------------


def mutate(path: str, value: Any) -> Callable[[Events], None]:
    """Set a dotted path (`5.item.call_id`) to a value, or delete it when value is DELETE."""

    def apply(events: Events) -> None:
        *head, last = path.split(".")
        target: Any = events
        for key in head:
            target = target[int(key)] if isinstance(target, list) else target[key]
        key = int(last) if isinstance(target, list) else last
        if value is DELETE:
            del target[key]
        else:
            target[key] = value

    return apply


DELETE = object()


def each(fn: Callable[[dict[str, Any]], None], start: int = 0) -> Callable[[Events], None]:
    def apply(events: Events) -> None:
        for event in events[start:]:
            fn(event)

    return apply


def insert(
    position: int, event: dict[str, Any] | Callable[[Events], Any]
) -> Callable[[Events], None]:
    def apply(events: Events) -> None:
        new = event(events) if callable(event) else copy.deepcopy(event)
        events.insert(position, new)
        renumber(events)

    return apply


def remove(position: int) -> Callable[[Events], None]:
    def apply(events: Events) -> None:
        del events[position]
        renumber(events)

    return apply


def move(src: int, dst: int) -> Callable[[Events], None]:
    def apply(events: Events) -> None:
        events.insert(dst, events.pop(src))
        renumber(events)

    return apply


def walk(obj: Any, fn: Callable[[dict[str, Any]], None]) -> None:
    """Apply fn to every dict nested in obj (events, items, terminal output)."""
    if isinstance(obj, dict):
        fn(obj)
        for value in obj.values():
            walk(value, fn)
    elif isinstance(obj, list):
        for value in obj:
            walk(value, fn)


def everywhere(
    match: Callable[[dict[str, Any]], bool], change: dict[str, Any]
) -> Callable[[Events], None]:
    """Change every nested dict that matches (added, done and terminal copies of an item)."""

    def fn(d: dict[str, Any]) -> None:
        if match(d):
            for key, value in change.items():
                if value is DELETE:
                    d.pop(key, None)
                else:
                    d[key] = value

    return lambda events: walk(events[2:], fn)  # never the echoed `tools` of created


def is_call(call_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda d: d.get("call_id") == call_id and "type" in d and "tools" not in d


def copy_of(position: int, **changes: Any) -> Callable[[Events], dict[str, Any]]:
    return lambda events: {**copy.deepcopy(events[position]), **changes}


def seq_shift(start: int) -> Callable[[Events], None]:
    def apply(events: Events) -> None:
        for event in events[start:]:
            event["sequence_number"] += 1

    return apply


def strip_ids(item_id: str) -> Callable[[Events], None]:
    def fn(d: dict[str, Any]) -> None:
        if d.get("id") == item_id:
            del d["id"]
        if d.get("item_id") == item_id:
            d["item_id"] = None

    return lambda events: walk(events, fn)


def stream_ids(events: Events) -> None:
    for event in events:
        event["stream_id"] = "lane-a"
    events[4]["stream_id"] = "lane-b"


TEXT_DELTA = {
    "type": "response.output_text.delta",
    "sequence_number": 0,  # renumbered on insert
    "item_id": "msg_text_001",
    "output_index": 0,
    "content_index": 0,
    "delta": "",
    "logprobs": [],
}

ANNOTATION = {
    "type": "response.output_text.annotation.added",
    "sequence_number": 0,  # renumbered on insert
    "item_id": "msg_text_001",
    "output_index": 0,
    "content_index": 0,
    "annotation_index": 0,
    "annotation": {"type": "url_citation", "url": "https://x", "title": "x",
                   "start_index": 0, "end_index": 1},
}  # fmt: skip

BROKEN: list[tuple[str, str, Callable[[Events], None], list[tuple[str, int]], bool]] = [
    # (case, fixture, mutation, expected [(rule, position)], check with the tool map)
    ("event malformed", "text.sse", mutate("1", "not an event"), [("event.malformed", 1)], False),
    ("sequence starts at 1", "text.sse", seq_shift(0), [("sequence.start", 0)], False),
    ("sequence gap", "text.sse", seq_shift(5), [("sequence.step", 5)], False),
    (
        "sequence missing",
        "text.sse",
        mutate("4.sequence_number", DELETE),
        [("sequence.missing", 4)],
        False,
    ),
    ("stream_id changes", "ws_turn.jsonl", stream_ids, [("stream_id.changed", 4)], False),
    ("first event is in_progress", "text.sse", remove(0), [("first_event", 0)], False),
    (
        "two response.created",
        "text.sse",
        insert(2, copy_of(0)),
        [("lifecycle.duplicate", 2)],
        False,
    ),
    (
        "response id changes",
        "text.sse",
        mutate("11.response.id", "resp_x"),
        [("response.id_changed", 11)],
        False,
    ),
    (
        "item without id",
        "namespaced_call.sse",
        strip_ids("fc_call_001"),
        [("item.id_missing", 2)],
        False,
    ),
    (
        "output_index skips",
        "parallel_calls.sse",
        each(lambda e: e.update(output_index=4) if "output_index" in e else None, 18),
        [("item.output_index", 18)],
        False,
    ),
    (
        "item added while open",
        "parallel_calls.sse",
        move(12, 13),
        [("item.added_while_open", 12)],
        False,
    ),
    (
        "item done with another type",
        "text.sse",
        mutate("10.item.type", "reasoning"),
        [("item.done_unmatched", 10)],
        False,
    ),
    ("item done twice", "text.sse", insert(11, copy_of(10)), [("item.done_unmatched", 11)], False),
    ("item never done", "text.sse", remove(10), [("item.not_done", 10)], False),
    ("incomplete item never done", "incomplete.sse", remove(8), [("item.not_done", 8)], False),
    (
        "delta for an unknown item",
        "text.sse",
        insert(6, {**TEXT_DELTA, "item_id": "msg_ghost"}),
        [("ref.item", 6)],
        False,
    ),
    (
        "delta with a wrong output_index",
        "text.sse",
        mutate("5.output_index", 3),
        [("ref.item", 5)],
        False,
    ),
    (
        "text delta on a function call",
        "namespaced_call.sse",
        insert(4, {**TEXT_DELTA, "item_id": "fc_call_001"}),
        [("ref.item_type", 4)],
        False,
    ),
    (
        "delta into a part never added",
        "text.sse",
        insert(5, {**TEXT_DELTA, "content_index": 1}),
        [("ref.part", 5)],
        False,
    ),
    (
        "annotation index skips one",
        "text.sse",
        insert(5, {**ANNOTATION, "annotation_index": 1}),
        [("annotation.index", 5)],
        False,
    ),
    (
        "annotation on a part never added",
        "text.sse",
        insert(5, {**ANNOTATION, "content_index": 1}),
        [("ref.part", 5)],
        False,
    ),
    (
        "pass-through event before its item",
        "text.sse",
        insert(
            2,
            {
                "type": "response.web_search_call.searching",
                "sequence_number": 0,
                "item_id": "ws_1",
                "output_index": 0,
            },
        ),
        [("ref.passthrough", 2)],
        False,
    ),
    (
        "pass-through event naming the backend's index",
        "text.sse",
        insert(
            5,
            {
                "type": "response.web_search_call.searching",
                "sequence_number": 0,
                "item_id": "msg_text_001",
                "output_index": 3,
            },
        ),
        [("ref.passthrough", 5)],
        False,
    ),
    ("part added twice", "text.sse", insert(4, copy_of(3)), [("part.index", 4)], False),
    ("part done twice", "text.sse", insert(10, copy_of(9)), [("part.unmatched", 10)], False),
    ("part never done", "text.sse", remove(9), [("part.not_done", 9)], False),
    ("delta after text done", "text.sse", insert(9, TEXT_DELTA), [("delta.after_done", 9)], False),
    (
        "output_text.done differs",
        "text.sse",
        mutate("8.text", "Retries"),
        [("done.mismatch", 8)],
        False,
    ),
    (
        "content_part.done differs",
        "text.sse",
        mutate("9.part.text", "x"),
        [("done.mismatch", 9)],
        False,
    ),
    (
        "item content differs",
        "text.sse",
        mutate("10.item.content.0.text", "x"),
        [("done.mismatch", 10)],
        False,
    ),
    (
        "refusal.done differs",
        "refusal.sse",
        mutate("6.refusal", "no"),
        [("done.mismatch", 6)],
        False,
    ),
    ("summary text differs", "reasoning.sse", mutate("6.text", "x"), [("done.mismatch", 6)], False),
    (
        "reasoning text differs",
        "reasoning.sse",
        mutate("12.text", "x"),
        [("done.mismatch", 12)],
        False,
    ),
    (
        "arguments.done differs",
        "namespaced_call.sse",
        mutate("6.arguments", "{}"),
        [("done.mismatch", 6)],
        False,
    ),
    (
        "item arguments differ",
        "namespaced_call.sse",
        mutate("7.item.arguments", "{}"),
        [("done.mismatch", 7)],
        False,
    ),
    (
        "custom input differs",
        "parallel_calls.sse",
        mutate("16.input", "x"),
        [("done.mismatch", 16)],
        False,
    ),
    (
        "call without call_id",
        "namespaced_call.sse",
        everywhere(is_call("call_a1"), {"call_id": DELETE}),
        [("call.id_missing", 2)],
        False,
    ),
    (
        "call_id changes on done",
        "namespaced_call.sse",
        mutate("7.item.call_id", "call_z"),
        [("call.id_changed", 7)],
        False,
    ),
    (
        "call_id changes on completed",
        "namespaced_call.sse",
        mutate("8.response.output.0.call_id", "call_z"),
        [("call.id_changed", 8)],
        False,
    ),
    (
        "call_id reused",
        "parallel_calls.sse",
        everywhere(is_call("call_b3"), {"call_id": "call_b1"}),
        [("call.id_duplicate", 18)],
        False,
    ),
    (
        "namespace dropped on done",
        "namespaced_call.sse",
        mutate("7.item.namespace", DELETE),
        [("call.identity_changed", 7)],
        False,
    ),
    (
        "namespace dropped on completed",
        "namespaced_call.sse",
        mutate("8.response.output.0.namespace", DELETE),
        [("call.identity_changed", 8)],
        False,
    ),
    (
        "namespace dropped on done (tool map)",
        "namespaced_call.sse",
        mutate("7.item.namespace", DELETE),
        [("tool.namespace_missing", 7)],
        True,
    ),
    (
        "flat name leaked",
        "namespaced_call.sse",
        everywhere(is_call("call_a1"), {"name": "mcp__docs__search", "namespace": DELETE}),
        [("tool.flat_name", 2)],
        True,
    ),
    (
        "namespace missing everywhere",
        "namespaced_call.sse",
        everywhere(is_call("call_a1"), {"namespace": DELETE}),
        [("tool.namespace_missing", 2)],
        True,
    ),
    (
        "undeclared namespaced tool",
        "namespaced_call.sse",
        everywhere(is_call("call_a1"), {"name": "delete"}),
        [("tool.undeclared", 2)],
        True,
    ),
    (
        "function call to a custom tool",
        "namespaced_call.sse",
        everywhere(is_call("call_a1"), {"name": "apply_patch", "namespace": "editor"}),
        [("tool.kind", 2)],
        True,
    ),
    (
        "terminal status",
        "text.sse",
        mutate("11.response.status", "in_progress"),
        [("terminal.status", 11)],
        False,
    ),
    ("two terminals", "text.sse", insert(12, copy_of(11)), [("terminal.trailing", 12)], False),
    (
        "delta after the terminal",
        "text.sse",
        insert(12, TEXT_DELTA),
        [("terminal.trailing", 12)],
        False,
    ),
    (
        "event after a bare error",
        "error.sse",
        insert(3, copy_of(1)),
        [("terminal.trailing", 3)],
        False,
    ),
    ("no terminal", "text.sse", remove(11), [("terminal.missing", 11)], False),
    (
        "terminal output empty",
        "text.sse",
        mutate("11.response.output", []),
        [("terminal.output", 11)],
        False,
    ),
    (
        "terminal output with another id",
        "parallel_calls.sse",
        mutate("22.response.output.1.id", "fc_other"),
        [("terminal.output", 22)],
        False,
    ),
]


@pytest.mark.parametrize(
    ("fixture", "mutation", "expected", "with_names"),
    [case[1:] for case in BROKEN],
    ids=[case[0] for case in BROKEN],
)
def test_broken_stream_reports_exactly_its_rule(
    fixture: str,
    mutation: Callable[[Events], None],
    expected: list[tuple[str, int]],
    with_names: bool,
) -> None:
    events = load(fixture)
    assert check(events, with_names=with_names, session=fixture.endswith(".jsonl")) == []
    mutation(events)
    found = check(events, with_names=with_names, session=fixture.endswith(".jsonl"))
    assert rules(found) == expected, [str(v) for v in found]
    assert all(v.rule in RULES and v.message for v in found)


def test_all_rules_but_a_few_are_exercised() -> None:
    exercised = {rule for case in BROKEN for rule, _ in case[3]}
    assert set(RULES) - exercised == set()


def test_undeclared_tool_is_not_judged_without_a_tool_map() -> None:
    events = load("namespaced_call.sse")
    everywhere(is_call("call_a1"), {"name": "delete"})(events)
    assert check(events) == []


def test_undeclared_top_level_name_passes_through() -> None:
    events = load("namespaced_call.sse")
    everywhere(is_call("call_a1"), {"name": "unknown_tool", "namespace": DELETE})(events)
    assert check(events, with_names=True) == []


def test_default_namespace_members_may_go_without_namespace() -> None:
    tools = [
        {
            "type": "namespace",
            "name": "functions",
            "description": "",
            "tools": [
                {
                    "type": "function",
                    "name": "search",
                    "parameters": {"type": "object", "properties": {}},
                }
            ],
        }
    ]
    events = load("namespaced_call.sse")
    everywhere(is_call("call_a1"), {"namespace": DELETE})(events)
    checker = GrammarChecker(ResponsesToolNames.convert(tools))
    assert [v for e in events for v in checker.feed(e)] + checker.finish() == []


def test_session_mode_still_requires_each_turn_to_start() -> None:
    events = load("ws_session.jsonl")
    second = next(
        i for i, e in enumerate(events) if e.get("response", {}).get("id") == "resp_ws_002"
    )
    del events[second]  # the second turn's response.created
    found = rules(check(events, session=True))
    assert found[0] == ("terminal.trailing", second)


def test_queued_then_created_is_allowed() -> None:
    events = load("text.sse")
    queued = {**copy.deepcopy(events[0]), "type": "response.queued"}
    queued["response"]["status"] = "queued"
    events.insert(0, queued)
    assert check(renumber(events)) == []


def test_websocket_error_without_sequence_number_is_a_clean_stream() -> None:
    event = {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": "x",
            "param": "previous_response_id",
        },
    }
    assert check([event]) == []
    assert rules(check([])) == [("terminal.missing", 0)]


def test_names_can_arrive_after_the_checker_was_built() -> None:
    events = load("namespaced_call.sse")
    everywhere(is_call("call_a1"), {"namespace": DELETE})(events)
    checker = GrammarChecker()
    checker.names = names()
    found = [v for e in events for v in checker.feed(e)]
    assert rules(found) == [("tool.namespace_missing", 2)]
