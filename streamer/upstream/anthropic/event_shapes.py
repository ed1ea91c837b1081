"""A Messages stream's per-token events as bytes templates: learn once, then slice (pure).

Within one content block, every `content_block_delta` of a kind (`text_delta`,
`thinking_delta`, `input_json_delta`) differs from the next in its string only: the same
`event:` line, type, index, keys in the same order, the same encoder. Once one such raw
event has been parsed, the bytes around its string are the block's `Shape` (head and tail,
responses/event_shapes.py's, with no number), proven by parsing the same bytes with `""` in
that place: a later event that is head + a JSON string + tail is, by the grammar of JSON,
the same event with that string, so only the string is parsed. Any other event goes to the
full decoder.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from streamer.upstream.responses.event_shapes import NO_SHAPE, Shape, fit

__all__ = ["FIELDS", "NO_SHAPE", "Shape", "fit", "learn_piece"]

FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
"""A delta's type -> the key of its string."""
_STRING = re.compile(rb'[ \t\r\n]*("(?:[^"\\]|\\.)*")', re.DOTALL)
_TRIES = 3  # occurrences of the key tried; one inside another value is skipped


def learn_piece(event: bytes, offset: int, obj: dict[str, Any]) -> Shape | None:
    """The shape of a raw `content_block_delta` event whose payload (from `offset`) parsed
    to `obj`; its `at` is the block's index."""
    delta = obj.get("delta")
    field = FIELDS.get(str(delta.get("type"))) if isinstance(delta, dict) else None
    if field is None or not isinstance(delta, dict):
        return None
    value = delta.get(field)
    payload, key = event[offset:], b'"' + field.encode() + b'":'
    found = -1
    for _ in range(_TRIES):
        found = payload.find(key, found + 1)
        if found < 0:
            return None
        literal = _STRING.match(payload, found + len(key))
        if literal is None:
            continue
        head, tail = payload[: literal.start(1)], payload[literal.end(1) :]
        try:  # the proof: "" there parses to the same event with "" in that place
            probe = orjson.loads(head + b'""' + tail)
        except orjson.JSONDecodeError:
            continue
        inner = probe.get("delta") if probe.__class__ is dict else None
        if inner.__class__ is not dict or inner.get(field) != "":
            continue
        inner[field] = value
        if probe == obj:
            return Shape(event[:offset] + head, b"", tail, 0, obj.get("index"))
    return None
