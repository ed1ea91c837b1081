"""A stream's per-token chunks as bytes templates: learn once, then slice (pure).

A backend streams hundreds of chunks per answer that differ in one JSON string only,
`delta.content` or one call's `function.arguments`: same id, model and created, same
keys in the same order, the same encoder. Once one such chunk has been parsed and
understood, the bytes before and after that string are the stream's `Shape`. A later
payload that starts and ends with them is, by the grammar of JSON, the same chunk with
another string in the same place, so only that string needs parsing. A payload that
does not fit goes to the full decoder, which may learn the shape again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

# A JSON string literal, after a key's colon (and the space some encoders put there).
_STRING = re.compile(rb'[ \t\r\n]*("(?:[^"\\]|\\.)*")', re.DOTALL)
_TRIES = 3  # occurrences of the key tried; a deeper `"content":` (logprobs) is skipped


class Shape(NamedTuple):
    head: bytes  # the payload up to the string's opening quote
    tail: bytes  # the payload after its closing quote
    call: int  # the tool call's index (argument fragments); 0 for text
    start: int  # len(head): where the string starts
    end: int  # -len(tail): where it ends, from the end


NO_SHAPE = Shape(b"", b"", 0, 0, 0)  # matches nothing (an empty head is never tried)


def _text_slot(obj: Any) -> dict[str, Any]:
    return obj["choices"][0]["delta"]


def _arguments_slot(obj: Any) -> dict[str, Any]:
    return obj["choices"][0]["delta"]["tool_calls"][0]["function"]


def learn_text(payload: bytes, obj: dict[str, Any]) -> Shape | None:
    """The shape of a chunk that `obj` (its parse) shows to be one piece of text."""
    return _learn(payload, obj, b'"content":', "content", _text_slot, 0)


def learn_arguments(payload: bytes, obj: dict[str, Any], index: int) -> Shape | None:
    """The shape of a chunk shown to be one argument fragment of call `index`."""
    return _learn(payload, obj, b'"arguments":', "arguments", _arguments_slot, index)


def _learn(
    payload: bytes,
    obj: dict[str, Any],
    key: bytes,
    name: str,
    slot: Callable[[Any], dict[str, Any]],
    index: int,
) -> Shape | None:
    value = slot(obj)[name]
    at = -1
    for _ in range(_TRIES):
        at = payload.find(key, at + 1)
        if at < 0:
            return None
        literal = _STRING.match(payload, at + len(key))
        if literal is None:
            continue
        head, tail = payload[: literal.start(1)], payload[literal.end(1) :]
        # Proof that this is the place: the same bytes with "" there parse to the same
        # object with "" in that slot, and to nothing else.
        try:
            probe = orjson.loads(head + b'""' + tail)
            container = slot(probe)
            if container.get(name) != "":
                continue
            container[name] = value
        except (orjson.JSONDecodeError, LookupError, TypeError, AttributeError):
            continue
        if probe == obj:
            return Shape(head, tail, index, len(head), -len(tail))
    return None
