"""Runs of per-token chunks decoded in a few C passes, not a Python step each (pure).

Once a stream's text (or argument) `Shape` is learnt (chunk_shapes), a payload that starts
with its head and an opening quote, ends with a closing quote and its tail, and whose middle
is the contents of one JSON string, is that chunk with that string. Here a batch's payloads
are classified with `map` (C loops), the contents of a run of consecutive such payloads are
sliced out with `map`, and all of them are proven to be one string each and decoded by one
`orjson.loads` of `["c1","c2",...]`. Anything that does not fit is left to the per-payload
path (`None`), which decodes it as it always did.

Why the join proves each piece: in `J = c1","c2",...,ck` (parsed as `["J"]`) the quotes
the join put in are 2(k-1); when no piece ends in a backslash none of them is escaped, so
all are string delimiters; if `J` has no other unescaped quote, no piece holds a delimiter
of its own: each `"ci"` is exactly one string literal. Backslashes pair left to right
inside strings (`\\\\` first, then `\\"`), which is how the unescaped quotes are counted.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import and_, getitem
from typing import NamedTuple

import orjson

from streamer.upstream.chat.chunk_shapes import Shape

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_startswith = bytes.startswith
_endswith = bytes.endswith
_getitem: Callable[[bytes, slice], bytes] = getitem  # type: ignore[assignment]


class RunKeys(NamedTuple):
    """A shape as a run needs it: the bytes around the string's contents."""

    head: bytes  # the shape's head and the opening quote
    tail: bytes  # the closing quote and the shape's tail
    slot: slice  # where the contents are in a payload of the shape
    least: int  # len(head) + len(tail): a shorter payload would overlap them


def run_keys(shape: Shape) -> RunKeys | None:
    """The run keys of a learnt shape (None for NO_SHAPE)."""
    if not shape.head:
        return None
    head, tail = shape.head + b'"', b'"' + shape.tail
    return RunKeys(head, tail, slice(len(head), -len(tail)), len(head) + len(tail))


def fits(payloads: list[bytes], keys: RunKeys | None) -> list[bool]:
    """Which payloads start and end as the shape does (`False`, `True` appended: sentinels
    for `index`)."""
    if keys is None:
        flags = [False] * len(payloads)
    else:
        starts = map(_startswith, payloads, repeat(keys.head))
        flags = list(map(and_, starts, map(_endswith, payloads, repeat(keys.tail))))
    flags += (False, True)
    return flags


def contents(run: list[bytes], keys: RunKeys) -> list[bytes] | None:
    """The string contents of a run of payloads that fit the shape, None if one is too short."""
    if min(map(len, run)) < keys.least:
        return None
    return list(map(_getitem, run, repeat(keys.slot)))


def strings(pieces: list[bytes]) -> list[str] | None:
    """Each piece decoded as the contents of one JSON string, or None if one is not
    exactly that (see the module's docstring for the proof)."""
    joined = b'","'.join(pieces)
    if b"\\" in joined:
        if any(map(_endswith, pieces, repeat(b"\\"))):
            return None
        paired = joined.replace(b"\\\\", b"")
        quotes = paired.count(b'"') - paired.count(b'\\"')
    else:
        quotes = joined.count(b'"')
    if quotes != 2 * (len(pieces) - 1):
        return None
    try:
        values = _loads(b'["' + joined + b'"]')
    except _JSONDecodeError:  # a control character, bad UTF-8, a bad escape, a lone surrogate
        return None
    return values if len(values) == len(pieces) else None
