"""`event_type`/`is_terminal` read any encoder's events right: the quick read against the parse.

The store learns a logged event's type from its bytes. The quick read (the object's first
member is `"type"` with a plain string) is a kept fast path: it spares parsing terminal
events, which hold the whole response. This differential test is its guard: for events
encoded with any member order, spacing or escaping, it gives what parsing gives.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.events import STREAM_END_TYPES
from streamer.store.base import event_type, is_terminal

TRICKY = st.sampled_from(['"', "\\", "\x00", "\n", ",", "}", "é", "😀", '","type":"x'])
TEXT = st.lists(st.one_of(st.text(max_size=5), TRICKY), max_size=5).map("".join)
TYPES = st.one_of(
    TEXT, st.sampled_from(sorted(STREAM_END_TYPES)), st.just("response.output_text.delta")
)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)


def encoders() -> st.SearchStrategy[Any]:
    """orjson as the gateway writes, and the stdlib with other spacing and escaping."""
    return st.sampled_from(
        [
            orjson.dumps,
            lambda v: json.dumps(v).encode(),
            lambda v: json.dumps(v, ensure_ascii=False).encode(),
            lambda v: json.dumps(v, separators=(",", ":")).encode(),
            lambda v: json.dumps(v, indent=1).encode() + b"\n",
        ]
    )


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    members = draw(st.dictionaries(TEXT.filter(lambda k: k != "type"), VALUES, max_size=4))
    kind = draw(st.one_of(TYPES, VALUES))  # a type that is no string, sometimes
    where = draw(st.sampled_from(["first", "last", "absent"]))
    if where == "first":
        return {"type": kind, **members}
    return {**members, "type": kind} if where == "last" else members


@settings(max_examples=500, deadline=None)
@given(event=events(), encode=encoders())
def test_the_type_is_what_parsing_the_event_gives(event: dict[str, Any], encode: Any) -> None:
    data = encode(event)
    parsed = orjson.loads(data).get("type")
    expected = parsed if isinstance(parsed, str) else None
    assert event_type(data) == expected
    assert is_terminal(data) == (expected in STREAM_END_TYPES)


def test_what_is_no_json_object_has_no_type() -> None:
    for data in [b"", b"[]", b'"response.completed"', b"{", b"\xff", b'{"type":"\xff"}']:
        assert event_type(data) is None
        assert not is_terminal(data)


def test_a_type_spelled_with_escapes_is_read() -> None:
    data = b'{"type":"response\\u002ecompleted","response":{}}'
    assert event_type(data) == "response.completed" and is_terminal(data)
