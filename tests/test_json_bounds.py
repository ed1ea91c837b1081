"""streamer/core/json_bounds.py: the bounded parse against its plain definitions.

Each fast path (the short bodies' plain parse, the serialisation probe, the wrapped parse,
the value bound and the chunked count) is compared with the plain Python definition of
what it decides, on generated JSON (strings full of quotes, escapes and brackets, blanks
anywhere), and orjson's own limits, which the module's constants restate, are pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core import json_bounds as jb
from streamer.core.call_kinds import json_object, local_shell_action
from streamer.core.client_tools import SHELL
from streamer.core.deltas import Annotation, ForeignEvent, ItemAdded, UpstreamError, WholeItem
from streamer.core.errors import RequestError
from streamer.core.json_bounds import MAX_DEPTH, MAX_ITEM_DEPTH
from streamer.turns.recorder import ExchangeRecorder
from streamer.upstream.chat.decoder import INVALID_CHUNK
from streamer.upstream.responses.decoder import ResponsesEventDecoder, decode_response_body

TRICKY = st.text(alphabet=st.sampled_from(list('ab",[]{}:\\ \n\t\u00e9\u4e16')), max_size=12)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False,
    allow_infinity=False), TRICKY,
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY, inner, max_size=5),
    max_leaves=40,
)


def depth(value: Any) -> int:
    """Arrays and objects nested in `value` (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def first_deep_path(value: Any, limit: int, path: str = "", level: int = 0) -> str | None:
    """The plain definition of `deep_path`: in document order, the path of the first array
    or object at level `limit + 1` (the body itself is level 1)."""
    if not isinstance(value, (dict, list)):
        return None
    if level == limit:
        return path
    children = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in children:
        step = (f".{key}" if path else key) if isinstance(value, dict) else f"[{key}]"
        found = first_deep_path(child, limit, path + step, level + 1)
        if found is not None:
            return found
    return None


def values(value: Any) -> int:
    """The plain definition of `value_count`: every value once, an empty container twice."""
    if isinstance(value, dict):
        return 1 + (sum(map(values, value.values())) if value else 1)
    if isinstance(value, list):
        return 1 + (sum(map(values, value)) if value else 1)
    return 1


def encodings(value: Any) -> list[bytes]:
    """`value` as compact JSON, with blanks everywhere, and with non-ASCII escaped."""
    return [
        json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(),
        json.dumps(value, indent=1, ensure_ascii=False).encode(),
        json.dumps(value, ensure_ascii=True).encode(),
    ]


def wrap(value: Any, levels: int) -> Any:
    """`value` under `levels` more levels, arrays and objects in turn."""
    for level in range(levels):
        value = {"k": value} if level % 2 else [value]
    return value


def cut(path: str) -> str:
    """A `param` path as the error gives it: past 256 characters, cut."""
    return path if len(path) <= 256 else path[:256] + "…"


# -- orjson's limits, as the module restates them ----------------------------------------


def test_orjson_limits_are_the_modules() -> None:
    orjson.loads(b"[" * jb.PARSEABLE_DEPTH + b"]" * jb.PARSEABLE_DEPTH)
    with pytest.raises(orjson.JSONDecodeError, match="depth"):  # `_wrapped` reads the message
        orjson.loads(b"[" * (jb.PARSEABLE_DEPTH + 1) + b"]" * (jb.PARSEABLE_DEPTH + 1))
    deepest = orjson.loads(b"[" * jb.SERIALISABLE_DEPTH + b"]" * jb.SERIALISABLE_DEPTH)
    orjson.dumps(deepest)
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps([deepest])
    assert jb.MAX_DEPTH + jb.WRAPPING == jb.SERIALISABLE_DEPTH


# -- depth ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(value=VALUES, extra=st.integers(0, 3), cut=st.integers(1, 8))
def test_too_deep_and_deep_path_match_the_plain_definitions(
    value: Any, extra: int, cut: int
) -> None:
    deep = wrap(value, MAX_DEPTH - cut + extra)
    too = depth(deep) > MAX_DEPTH
    assert jb.too_deep(deep, MAX_DEPTH) is too
    for raw in encodings(deep):
        assert jb.deep_path(raw, MAX_DEPTH) == first_deep_path(deep, MAX_DEPTH)
        assert jb.deep_path(raw.decode(), MAX_DEPTH) == first_deep_path(deep, MAX_DEPTH)


@settings(max_examples=200, deadline=None)
@given(value=VALUES, levels=st.integers(0, 260))
def test_loads_is_orjson_loads_within_max_depth_and_a_400_beyond(value: Any, levels: int) -> None:
    deep = wrap(value, levels)
    for raw in encodings(deep):
        for parse in (jb.loads, jb._wrapped):  # every size, and the long bodies' path
            for text in (raw, raw.decode(), bytearray(raw), memoryview(raw)):
                if depth(deep) <= MAX_DEPTH:
                    assert parse(text) == orjson.loads(raw) == value or levels
                    continue
                with pytest.raises(RequestError) as caught:
                    parse(text)
                path = first_deep_path(deep, MAX_DEPTH)
                assert caught.value.status == 400 and caught.value.code == "json_too_deep"
                assert caught.value.param == cut(path)


def test_long_bodies_take_the_wrapped_parse_and_short_ones_the_plain_parse() -> None:
    pad = "x" * jb._WRAP_FROM
    for levels in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 600, 1023, 1024, 1100):
        raw = b'{"pad":"' + pad.encode() + b'","v":' + b"[" * levels + b"]" * levels + b"}"
        if levels + 1 <= MAX_DEPTH:
            assert jb.loads(raw) == orjson.loads(raw)
            continue
        with pytest.raises(RequestError) as caught:
            jb.loads(raw)
        assert caught.value.param == cut("v" + "[0]" * (MAX_DEPTH - 1))
    assert jb.loads(b"[" * 200 + b"]" * 200) == orjson.loads(b"[" * 200 + b"]" * 200)


INVALID = [
    b"", b" ", b"1],[2", b"[1]],[[2]", b"{}]", b"[", b"]", b"1 2", b'{"a":1}}{"b":',
    b"[1,]", b"nul", b'"\\ud800"', b"\xff", b"1e400", b"[]" * 3,
]  # fmt: skip


@pytest.mark.parametrize("raw", INVALID)
@pytest.mark.parametrize("padded", [False, True], ids=["as is", "long"])
def test_invalid_json_fails_as_orjson_fails(raw: bytes, padded: bool) -> None:
    """The wrapped parse must not take what is not one JSON value (`1],[2` closes a wrapper
    and opens another), and must fail with orjson's own message."""
    if padded:
        raw = b" " * jb._WRAP_FROM + raw
    with pytest.raises(orjson.JSONDecodeError) as plain:
        orjson.loads(raw)
    for parse in (jb.loads, jb._wrapped):
        with pytest.raises(orjson.JSONDecodeError) as bounded:
            parse(raw)
        assert bounded.value.msg == plain.value.msg


# -- values --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_value_count_is_the_plain_count(value: Any) -> None:
    for raw in encodings(value):
        assert jb.value_count(raw) == values(value)
        assert values(value) <= 1 + 2 * len(raw) / 3  # the bound `loads` skips the count by
        assert len(raw.translate(None, jb._NOT_BEFORE_VALUE)) + 1 >= values(value)


def test_value_count_across_chunks_and_escapes() -> None:
    """Strings that span chunk boundaries, escaped quotes and backslashes next to them."""
    tricky = ['\\"', '\\\\"', "\\", '"', ",[{" * 5000, "\\\\\\"]
    value = [{"k" * 70_000: [s, {s: s}, []]} for s in tricky] * 3
    for raw in encodings(value):
        assert jb.value_count(raw) == values(value)


@pytest.mark.parametrize(
    "raw",
    [b"[" + b"{}," * 600 + b"{}]", b'["' + b",[{" * 2000 + b'"]', b"[" + b"0," * 900 + b"0]"],
    ids=["objects", "brackets in a string", "numbers"],
)
def test_the_value_cap(raw: bytes) -> None:
    count = values(orjson.loads(raw))
    assert jb.loads(raw, max_values=count) == orjson.loads(raw)
    assert jb.loads(raw.decode(), max_values=count) == orjson.loads(raw)
    with pytest.raises(RequestError) as caught:
        jb.loads(raw, max_values=count - 1)
    assert caught.value.status == 400 and caught.value.code == "too_many_json_values"
    assert f"{count:,} values" in caught.value.message


# -- a backend's JSON, passed on -----------------------------------------------------------


def nested_list(levels: int) -> Any:
    return orjson.loads(b"[" * levels + b"]" * levels)


def test_loads_within_refuses_as_invalid_json_what_is_too_deep() -> None:
    assert jb.loads_within("[" * MAX_ITEM_DEPTH + "]" * MAX_ITEM_DEPTH) == nested_list(
        MAX_ITEM_DEPTH
    )
    for text in ("[" * (MAX_ITEM_DEPTH + 1) + "]" * (MAX_ITEM_DEPTH + 1), "[" * 2000):
        with pytest.raises(orjson.JSONDecodeError):
            jb.loads_within(text)
    assert jb.loads_within(b'"x"') == "x" and jb.loads_within("1") == 1


def test_a_models_arguments_too_deep_for_an_item_take_the_not_json_way() -> None:
    deep = "[" * 300 + "]" * 300
    assert json_object(deep) == {"query": deep}  # tool_search: the raw text
    assert SHELL.call_fields('{"commands": ' + deep + "}") == {"action": {"commands": []}}
    assert local_shell_action('{"command": ' + deep + "}")["command"] == []


def responses_events(*events: bytes) -> list[Any]:
    return ResponsesEventDecoder().decode(list(events))


def test_a_foreign_item_or_event_past_max_item_depth_is_a_clear_upstream_error() -> None:
    for levels, passes in ((MAX_ITEM_DEPTH - 1, True), (MAX_ITEM_DEPTH, False), (600, False)):
        item = b'{"type":"vendor_thing","data":' + b"[" * levels + b"]" * levels + b"}"
        done = b'data: {"type":"response.output_item.done","output_index":0,"item":' + item + b"}"
        vendor = b'data: {"type":"response.vendor","x":' + b"[" * levels + b"]" * levels + b"}"
        body = b'{"object":"response","status":"completed","output":[' + item + b"]}"
        added = done.replace(b"output_item.done", b"output_item.added")
        deep = b"[" * (levels - 4) + b"]" * (levels - 4)  # under item, content, part, list
        note = b'data: {"type":"response.output_text.annotation.added","output_index":0,'
        note += b'"annotation":{"type":"url_citation","x":' + deep + b"}}"
        message = b'{"type":"message","content":[{"type":"output_text","text":"t","annotations":'
        message += b'[{"type":"url_citation","x":' + deep + b"}]}]}"
        whole = b'data: {"type":"response.output_item.done","output_index":0,"item":' + message
        cases = [done, vendor, added, note, whole + b"}"]
        for out in [*map(responses_events, cases), decode_response_body(body)]:
            if passes:
                assert not any(isinstance(d, UpstreamError) for d in out), out
                assert any(
                    isinstance(d, WholeItem | ForeignEvent | ItemAdded | Annotation) for d in out
                )
                continue
            assert isinstance(out[-1], UpstreamError) and out[-1].code == INVALID_CHUNK, out
            assert f"more than {MAX_ITEM_DEPTH} levels" in out[-1].message


def test_the_recorder_writes_a_line_for_what_it_cannot_serialise(tmp_path: Path) -> None:
    recorder = ExchangeRecorder(tmp_path / "r.jsonl")
    recorder.client_request(nested_list(300))  # never raises into the turn
    recorder.backend_request({"ok": True})
    recorder.close()
    lines = [orjson.loads(line) for line in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert [line["kind"] for line in lines] == ["client_request", "backend_request"]
    assert "unrecorded" in lines[0] and lines[1]["body"] == {"ok": True}
