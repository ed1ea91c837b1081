"""QueueBudget: the per-socket bound on frames and bytes held across lanes (plain values),
and `frame_cost`, what a frame is charged: never less than its parsed objects measure."""

from __future__ import annotations

import sys
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.frontends.ws_queue import Admission, QueueBudget, frame_cost

ACCEPT, REJECT, CLOSE = Admission.ACCEPT, Admission.REJECT, Admission.CLOSE


def test_frames_bound_counts_every_held_frame() -> None:
    budget = QueueBudget(max_bytes=1000, max_frames=3, max_rejected=5)
    assert [budget.offer(10) for _ in range(4)] == [ACCEPT, ACCEPT, ACCEPT, REJECT]
    assert (budget.frames, budget.bytes) == (3, 30)  # the rejected frame holds nothing


def test_bytes_bound_is_checked_before_taking() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=10, max_rejected=5)
    assert budget.offer(60) is ACCEPT
    assert budget.offer(41) is REJECT  # 101 > 100
    assert budget.offer(40) is ACCEPT  # exactly at the bound is allowed
    assert (budget.frames, budget.bytes) == (2, 100)


def test_release_makes_room_again() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=1, max_rejected=5)
    assert budget.offer(80) is ACCEPT
    assert budget.offer(80) is REJECT
    budget.release(80)
    assert (budget.frames, budget.bytes) == (0, 0)
    assert budget.offer(80) is ACCEPT


def test_close_after_max_rejected_in_a_row() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=2)
    assert budget.offer(5) is ACCEPT
    assert [budget.offer(5) for _ in range(3)] == [REJECT, REJECT, CLOSE]


def test_an_accepted_frame_resets_the_count() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=2)
    budget.offer(5)
    assert [budget.offer(5), budget.offer(5)] == [REJECT, REJECT]
    budget.release(5)
    assert budget.offer(5) is ACCEPT  # the client paced itself: it starts over
    assert [budget.offer(5), budget.offer(5), budget.offer(5)] == [REJECT, REJECT, CLOSE]


def test_zero_rejections_allowed_closes_on_the_first() -> None:
    budget = QueueBudget(max_bytes=10, max_frames=1, max_rejected=0)
    budget.offer(5)
    assert budget.offer(5) is CLOSE


def test_a_frame_larger_than_the_bound_is_never_taken() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=10, max_rejected=5)
    assert budget.offer(101) is REJECT
    assert "larger than this connection may queue (100 bytes)" in budget.describe(101)
    assert (budget.frames, budget.bytes) == (0, 0)


def test_describe_says_what_is_held_and_the_bounds() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=2, max_rejected=5)
    budget.offer(30)
    budget.offer(30)
    message = budget.describe(30)
    assert "2 frames, 60 bytes" in message
    assert "at most 2 frames and 100 bytes" in message


def test_release_never_goes_negative_and_clear_resets() -> None:
    budget = QueueBudget(max_bytes=100, max_frames=2, max_rejected=1)
    budget.release(50)
    assert (budget.frames, budget.bytes) == (0, 0)
    budget.offer(60)
    budget.offer(60)
    budget.clear()
    assert (budget.frames, budget.bytes, budget.rejected) == (0, 0, 0)


# -- frame_cost: an upper bound of what the parsed frame holds ------------------------


def held(value: Any) -> int:
    """The bytes the parsed objects take: each distinct object once (orjson shares keys;
    None, True and False are the interpreter's own)."""
    seen = {id(None), id(True), id(False)}
    stack, total = [value], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return total


def assert_bounded(raw: str | bytes) -> None:
    assert held(orjson.loads(raw)) <= frame_cost(raw), raw[:80]


def items(item: str, n: int = 2000) -> str:
    return '{"type":"response.create","input":[' + ",".join([item] * n) + "]}"


def test_a_frame_of_empty_objects_is_charged_what_its_objects_hold() -> None:
    """The issue's attack: `{}` items are 3 bytes of text and 72 bytes once parsed."""
    raw = items("{}", 100_000)
    cost = frame_cost(raw)
    assert cost >= held(orjson.loads(raw)) > 20 * sys.getsizeof(raw)
    assert abs(frame_cost(raw.encode()) - cost) < 100  # binary alike


def test_the_costliest_shapes_stay_under_their_charge() -> None:
    """Each character kind at its worst: one-key dicts nested and in lists, long (unshared)
    keys, lists of lists, wide and big numbers, short strings, non-ASCII strings."""
    long_key = "k" * 100
    for item in (
        "{}", "[]", "[[]]", "[1000]", '{"a":0}', '{"a":{}}', '{"a":1000}', '{"a":1.5}',
        f'{{"{long_key}":1000}}', '""', '"a"', '"é"', "1.5", "1000", "18446744073709551615",
        "-9223372036854775808", '{"a":0,"b":0,"c":0,"d":0,"e":0,"f":0}', "[[[[[[1000]]]]]]",
    ):  # fmt: skip
        assert_bounded(items(item))
        assert_bounded(items(item).encode())
    for depth in (1, 50, 500):
        assert_bounded('{"a":' * depth + "1000" + "}" * depth)
        assert_bounded("[" * depth + "1000" + "]" * depth)
    for keys in (1, 5, 6, 11, 22, 43, 86, 171, 342, 683, 1366):
        wide = "{" + ",".join(f'"{i:0>70}":1000' for i in range(keys)) + "}"
        assert_bounded("[" + ",".join([wide] * 10) + "]")


def test_escapes_that_widen_a_string_are_charged_the_widest_width() -> None:
    """One escape past U+00FF makes a whole string 2 (or 4) bytes per character."""
    for escape in ("\\u0100", "\\ud83d\\ude00"):
        raw = '["' + escape + "a" * 100_000 + '"]'
        assert_bounded(raw)
        assert_bounded(raw.encode())
    latin = '["\\u00e9' + "a" * 100_000 + '"]'  # Latin-1: as narrow as the text
    assert frame_cost(latin) < 2 * sys.getsizeof(latin)
    utf8 = ('["\U0001f600' + "a" * 100_000 + '"]').encode()  # a binary frame's UTF-8
    assert_bounded(utf8)


def test_text_frames_are_charged_little_more_than_their_size() -> None:
    """A frame that is mostly text (a prompt, a tool output) costs about its length."""
    raw = orjson.dumps({"type": "response.create", "input": "hello world. " * 10_000}).decode()
    assert frame_cost(raw) < 1.01 * sys.getsizeof(raw)


_keys = st.text(max_size=80)
_leaves = (
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=40)
)  # fmt: skip
_json = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(_keys, inner, max_size=12),
    max_leaves=200,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_generated_json_never_holds_more_than_it_is_charged(value: Any, binary: bool) -> None:
    raw = orjson.dumps(value)
    assert_bounded(raw if binary else raw.decode())
