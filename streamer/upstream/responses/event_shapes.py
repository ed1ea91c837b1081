"""A Responses stream's per-token events as bytes templates: learn once, then slice (pure).

A backend streams hundreds of `response.output_text.delta` (or reasoning, refusal, argument)
events per answer that differ in two values only: the `delta` string and the
`sequence_number` after it (vLLM, the load backend; same type, item, indexes, keys in the same
order, the same encoder). Once one such raw event (its `event:` line and its `data:` line) has
been parsed and understood, the bytes around those two values are the stream's `Shape`: head,
middle and tail. A later raw event that is head + a JSON string + middle + a JSON integer +
tail is, by the grammar of JSON, the same event with those two values in their places, so
only the string needs parsing. An event that does not fit (OpenAI's, whose per-event
`obfuscation` and leading `sequence_number` change every event) goes to the full decoder.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# A JSON string literal after a key's colon (and the space some encoders put there).
_STRING = re.compile(rb'[ \t\r\n]*("(?:[^"\\]|\\.)*")', re.DOTALL)
_NUMBER = re.compile(rb'"sequence_number":[ ]?(\d+)')
_TRIES = 3  # occurrences of `"delta":` tried; one inside another value is skipped
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class Shape:
    """A learnt event: head + a JSON string + middle + a JSON integer + tail (with no
    middle: head + a JSON string + tail)."""

    __slots__ = ("at", "end", "head", "middle", "start", "tail", "width")

    def __init__(self, head: bytes, middle: bytes, tail: bytes, width: int, at: Any) -> None:
        self.head = head  # the raw event up to the delta string's opening quote
        self.middle = middle  # from its closing quote to the sequence number (b"": none)
        self.tail = tail  # after the number (or after the string, with none)
        self.start = len(head)
        self.end = len(tail)
        self.width = width  # the last number's digits: where the middle is, most times
        self.at = at  # the backend item the events are about (`output_index`, or its id)


NO_SHAPE = Shape(b"", b"", b"", 0, None)  # matches nothing (an empty head is never tried)


def fit(shape: Shape, event: bytes) -> str | None:
    """The delta string of `event` if it has the shape (its head already compared)."""
    end = len(event) - shape.end
    if event[end:] != shape.tail:
        return None
    middle = shape.middle
    if middle:
        width = shape.width
        at = end - width - len(middle)
        digits = event[end - width : end]
        # The middle ends in a non-digit: found there, the digits before `end` are all of
        # the number. Any split into a string, the middle and an integer proves the same
        # template, so, the width changed, the last middle is as good as any.
        if at < shape.start or event[at : end - width] != middle or not digits.isdigit():
            at = event.rfind(middle, shape.start, end)
            digits = event[at + len(middle) : end]
            if at < 0 or not digits.isdigit():
                return None
            shape.width = len(digits)
        if digits[0] == 48 and len(digits) > 1:
            return None  # a leading zero: not JSON
        end = at
    try:
        value = _loads(event[shape.start : end])
    except _JSONDecodeError:
        return None
    return value if value.__class__ is str else None


def learn(event: bytes, offset: int, obj: dict[str, Any], at: Any) -> Shape | None:
    """The shape of a raw event whose payload (from `offset`) parsed to `obj`, one delta."""
    payload = event[offset:]
    value = obj["delta"]
    found = -1
    for _ in range(_TRIES):
        found = payload.find(b'"delta":', found + 1)
        if found < 0:
            return None
        literal = _STRING.match(payload, found + 8)
        if literal is None:
            continue
        head, rest = payload[: literal.start(1)], payload[literal.end(1) :]
        number = _NUMBER.search(rest)
        if number is not None:
            middle, tail = rest[: number.start(1)], rest[number.end(1) :]
            probe_bytes = head + b'""' + middle + b"0" + tail
        else:
            middle, tail = b"", rest
            probe_bytes = head + b'""' + tail
        # Proof that these are the places: the same bytes with "" and 0 there parse to the
        # same object with "" and 0 in those slots, and to nothing else.
        try:
            probe = orjson.loads(probe_bytes)
        except orjson.JSONDecodeError:
            continue
        if probe.__class__ is not dict or probe.get("delta") != "":
            continue
        probe["delta"] = value
        if number is not None:
            if probe.get("sequence_number") != 0:
                continue
            probe["sequence_number"] = obj.get("sequence_number")
        if probe == obj:
            width = number.end(1) - number.start(1) if number is not None else 0
            return Shape(event[:offset] + head, middle, tail, width, at)
    return None
