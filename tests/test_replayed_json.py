"""A replayed body parsed past its known bytes against the plain parse (differential).

`ReplayedBodies.loads` parses a body that starts with a kept body's bytes up to the end of
its `input` as the short body without them. On random conversations of bodies (random key
orders, members before and after `input` that spell `"input": [` or `],"tools":` inside
strings and nested objects, four JSON writers, whitespace), each replaying the last with
more items, or changing an earlier byte, or written another way, every parse must equal
`orjson.loads` (or raise the 400 the plain parse raises); the item_references found in a
replayed input must be the plain ones; and a replay must be recognised (a hit) whenever its
bytes start with the last body's.
"""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamer.core import item_references, json_bounds, replayed_json
from streamer.core.errors import RequestError
from streamer.core.replayed_json import KnownInput, ReplayedBodies, input_span
from streamer.frontends.endpoint import parse_body

TRICKY = st.sampled_from(
    ['"input":[', '],"tools":', "]", ",", '\\"', "tools", "input", "x", "é", "\u2028", "}"]
)
TEXT = st.lists(TRICKY, max_size=4).map("".join)
ITEM = st.one_of(
    st.builds(lambda t: {"type": "message", "role": "user", "content": t}, TEXT),
    st.builds(lambda t: {"type": "function_call_output", "call_id": "c", "output": t}, TEXT),
    st.builds(lambda i: {"type": "item_reference", "id": f"msg_{i}"}, st.integers(0, 3)),
    st.builds(lambda i: {"id": f"rs_{i}"}, st.integers(0, 3)),
    st.just({"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a":[1]}'}),
)
TOOLS = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("namespace"), "name": TEXT,
         "tools": st.just([{"type": "function", "name": "run", "input": [1, 2],
                            "parameters": {"required": ["q"]}}])}
    ),
    max_size=2,
)  # fmt: skip
WRITERS = {
    "orjson": orjson.dumps,
    "spaced": lambda v: json.dumps(v).encode(),
    "ascii": lambda v: json.dumps(v, separators=(",", ":")).encode(),
    "indented": lambda v: json.dumps(v, indent=1, ensure_ascii=False).encode(),
}
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


def body(fields: list[tuple[str, Any]], items: list[Any]) -> dict[str, Any]:
    return {k: (items if k == "input" else v) for k, v in fields}


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except RequestError as exc:
        return ("400", exc.message, exc.code)
    except orjson.JSONDecodeError as exc:
        return ("json", exc.msg)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[tuple[str, Any]], list[Any], list[Any]]:
    fields = [
        ("model", draw(TEXT)), ("instructions", draw(TEXT)), ("input", None),
        ("tools", draw(TOOLS)), ("stream", draw(st.booleans())), ("metadata", {"input": draw(TEXT)}),
    ]  # fmt: skip
    order = draw(st.permutations(fields))
    first = draw(st.lists(ITEM, max_size=6))
    turns = draw(
        st.lists(
            st.tuples(
                st.lists(ITEM, max_size=3),
                st.sampled_from(["replay"] * 5 + ["earlier", "head", "writer", "broken", "comma"]),
            ),
            min_size=1,
            max_size=5,
        )
    )
    return order, first, turns


FIELDS = [("model", "m"), ("input", None), ("tools", [])]
ONE = [{"type": "message", "role": "user", "content": "a"}]


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW)
@given(conversations(), st.sampled_from(sorted(WRITERS)), st.sampled_from([10**6, 60, 25]))
@example((FIELDS, ONE, [([], "comma")]), "orjson", 10**6)  # `,]` right after the kept items
@example((FIELDS, ONE, [([], "replay")]), "indented", 10**6)
def test_every_body_parses_as_the_plain_parse(conv: Any, writer: str, limit: int) -> None:
    """`limit`: --max-json-values (small ones count the values of short bodies too)."""
    fields, items, turns = conv
    bodies = ReplayedBodies(1 << 24)
    write = WRITERS[writer]
    with mock.patch.object(replayed_json, "MIN_BYTES", 0):
        raw = write(body(fields, items))
        got = outcome(bodies.loads, raw, "c", limit)
        assert got == outcome(json_bounds.loads, raw, limit)
        for new, change in turns:
            kept = got[0] == "ok"  # the last body was parsed, so kept
            previous = raw
            items = [*items, *new]
            value = body(fields, items)
            if change == "earlier" and items:
                value["input"] = [{"type": "message", "role": "user", "content": "?"}, *items[1:]]
            elif change == "head":
                value = {**value, "model": "other"}
            raw = (WRITERS["spaced"] if change == "writer" else write)(value)
            if change == "broken":
                raw = raw[:-1] + b",}"
            elif change == "comma" and items:  # a comma after the kept items, and no item after it
                raw = raw.replace(orjson.dumps(items[-1]) + b"]", orjson.dumps(items[-1]) + b",]")
            hits = bodies.hits
            got = outcome(bodies.loads, raw, "c", limit)
            assert got == outcome(json_bounds.loads, raw, limit), (raw, got)
            span = _known_end(previous)
            replayed = span is not None and raw.startswith(previous[:span])
            if change == "replay" and kept and got[0] == "ok" and replayed:
                assert bodies.hits == hits + 1  # recognised
            if got[0] == "ok" and isinstance(got[1], dict):
                found = got[1].get("input")
                plain = list(found) if isinstance(found, list) else found
                assert outcome(item_references.referenced_ids, found) == outcome(
                    item_references.referenced_ids, plain
                )


def _known_end(raw: bytes) -> int | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    span = input_span(raw, value) if isinstance(value.get("input"), list) else None
    return span[1] if span is not None else None


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_the_span_of_input_is_found_and_proved(writer: str) -> None:
    value = {
        "tools": [{"type": "namespace", "name": 'x"input":[', "tools": [{"input": [1]}]}],
        "instructions": '],"tools": and "input": [',
        "input": [{"type": "message", "role": "user", "content": '],"tools":'}],
        "tools2": {"tools": []},
        "stream": True,
    }
    raw = WRITERS[writer](value)
    span = input_span(raw, value)
    assert span is not None
    start, end = span
    items = orjson.loads(b"[" + raw[start:end] + b"]")
    assert items == value["input"]


def test_a_replay_keeps_the_earlier_items_as_they_were() -> None:
    bodies = ReplayedBodies(1 << 24)
    items = [{"type": "message", "role": "user", "content": "x" * 1000} for _ in range(80)]
    first = {"model": "m", "input": items, "tools": []}
    one = bodies.loads(orjson.dumps(first), "c")
    two = bodies.loads(orjson.dumps({**first, "input": [*items, {"type": "message",
                                     "role": "user", "content": "more"}]}), "c")  # fmt: skip
    assert isinstance(two["input"], KnownInput) and two["input"].known == 80
    assert all(a is b for a, b in zip(two["input"], one["input"], strict=False))
    other = bodies.loads(orjson.dumps({**first, "input": [*items, *items[:1]]}), "other")
    assert not isinstance(other["input"], KnownInput)  # another client's body is not used
    assert bodies.hits == 1


def test_the_values_of_the_whole_body_are_bounded() -> None:
    bodies = ReplayedBodies(1 << 24)
    items = [{"type": "message", "role": "user", "content": "x" * 1000} for _ in range(80)]
    bodies.loads(orjson.dumps({"model": "m", "input": items}), "c")
    more = [*items, *([{"type": "message", "role": "user", "content": "y"}] * 200)]
    raw = orjson.dumps({"model": "m", "input": more})
    limit = 600  # the whole body holds more values than this, its new part fewer
    assert outcome(bodies.loads, raw, "c", limit) == outcome(json_bounds.loads, raw, limit)
    assert outcome(bodies.loads, raw, "c", limit)[0] == "400"


def test_what_is_kept_stays_within_its_bytes() -> None:
    """Try to exceed the bound: many clients' long bodies."""
    bodies = ReplayedBodies(2 * 1024 * 1024)
    items = [{"type": "message", "role": "user", "content": "x" * 1000} for _ in range(80)]
    for i in range(40):
        bodies.loads(orjson.dumps({"model": f"m{i}", "input": items}), f"c{i}")
        assert bodies.bytes <= bodies.max_bytes
    assert bodies.bytes > 0


def test_the_fast_path_parse_and_the_plain_one_answer_alike() -> None:
    items = [{"type": "message", "role": "user", "content": "x" * 1000} for _ in range(80)]
    bodies = ReplayedBodies(1 << 24)
    raw = orjson.dumps({"model": "m", "input": items})
    parse_body(raw, bodies=bodies, authorization="Bearer k")
    bad = raw[:-2] + b",]}"
    with pytest.raises(RequestError) as cached:
        parse_body(bad, bodies=bodies, authorization="Bearer k")
    with pytest.raises(RequestError) as plain:
        parse_body(bad)
    assert cached.value.message == plain.value.message
