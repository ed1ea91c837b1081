"""A request body that starts with a recent one's bytes: only the rest is parsed (pure, bounded).

A client that replays its history (Codex over HTTP, `store: false`) sends, turn after turn,
the same bytes up to the end of the last turn's `input`, then what came of it. Parsing those
bytes again costs as much as the parse of the whole body, and building the same objects again
as much, every turn. So a long body is kept (`Known`: its bytes up to the `]` that closes its
`input`, where that array's first item starts, and the items parsed), per client, and a later
body that starts with exactly those bytes, followed by `,` (more items) or `]`, is parsed as
the same body without them (`head[ + rest]`: a short one), its `input` the kept items and
then its own (`KnownInput`: the kept items are the same objects, so a comparison of them is
one of pointers).

The answer is the plain parse's (tests/test_replayed_json.py holds them to it): the bytes
before the cut are the kept body's, so the parser is where it was in the kept body there,
inside `input` after its last item; the bounds hold as for the whole body (the values of all
its bytes counted; the kept items were as deep as they are when they were first parsed); a
body the short parse cannot take is parsed plainly, for the plain parse's error.

Where `input` ends is found from the end of the body (the key after it, preceded by `]`
and `,`), and proved: the body without its items must parse as the body with an empty
`input`. A body where that fails is not kept.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson

from streamer.core import json_bounds
from streamer.core.errors import RequestError
from streamer.core.item_references import is_reference
from streamer.core.json_bounds import Raw

MIN_BYTES = 64 * 1024  # shorter bodies are parsed as they are, and not kept
PER_CLIENT = 4  # bodies kept per client (parallel conversations)
TRIES = 8  # candidates tried for each end of `input` (the proof parses a short body each)
_WHITESPACE = b" \t\n\r"
_COMMA, _CLOSE = 0x2C, 0x5D


class KnownInput(list[Any]):
    """A parsed `input` whose first `known` items are the items of a kept body's `input`
    (`source`, that very list: the same objects); `references`: whether any of those is an
    item_reference (core/item_references.py)."""

    __slots__ = ("known", "references", "source")

    def __init__(self, items: list[Any], references: bool) -> None:
        super().__init__(items)
        self.known = len(items)
        self.references = references
        self.source = items


@dataclass(slots=True)
class Known:
    prefix: memoryview  # the body (kept whole, not copied) up to the `]` closing `input`
    start: int  # where that array's first item starts (just past its `[`)
    items: list[Any]  # its items, parsed
    references: bool  # one of them is an item_reference
    values: int | None = None  # `json_bounds.value_bound(prefix)`, once it was needed


class ReplayedBodies:
    """The long bodies of recent requests, `PER_CLIENT` per client, at most `max_bytes` of
    them in all (their bytes counted twice: the items they hold cost as much again)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._clients: OrderedDict[str, deque[Known]] = OrderedDict()

    def loads(self, raw: Raw, client: str, max_values: int = json_bounds.MAX_VALUES) -> Any:
        """`json_bounds.loads(raw, max_values)`, the bytes of a kept body not parsed again;
        the body kept for `client`'s next one."""
        if len(raw) < MIN_BYTES or not isinstance(raw, bytes | bytearray):
            return json_bounds.loads(raw, max_values)
        for known in reversed(self._clients.get(client, ())):
            value = _continued(raw, known, max_values)
            if value is not None:
                self.hits += 1
                self._keep(raw, value, client, known)
                return value
        value = json_bounds.loads(raw, max_values)
        self._keep(raw, value, client, None)
        return value

    def _keep(self, raw: bytes | bytearray, value: Any, client: str, known: Known | None) -> None:
        items = value.get("input") if value.__class__ is dict else None
        if not isinstance(items, list):
            return
        if known is None:
            span = input_span(raw, value)
        else:  # the same head: `input` starts where it did, and ends past the kept bytes
            span = input_span(raw, value, len(known.prefix), known.start)
        if span is None:
            return
        start, end = span
        if known is not None and isinstance(items, KnownInput):
            references = known.references or _any_reference(items[items.known :])
        else:
            references = _any_reference(items)
        values = None
        if known is not None and known.values is not None:  # the bound of its bytes, on
            values = known.values + json_bounds.value_bound(raw[len(known.prefix) : end])
        kept = Known(memoryview(raw)[:end], start, items, references, values)
        size = 2 * len(kept.prefix)
        if size > self.max_bytes:
            return
        bodies = self._clients.pop(client, None) or deque()
        if len(bodies) == PER_CLIENT:
            self.bytes -= 2 * len(bodies.popleft().prefix)
        bodies.append(kept)
        self._clients[client] = bodies  # the most recent client last
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest = next(iter(self._clients.values()))
            self.bytes -= 2 * len(oldest.popleft().prefix)
            if not oldest:
                self._clients.popitem(last=False)


def _continued(raw: bytes | bytearray, known: Known, max_values: int) -> dict[str, Any] | None:
    """`raw` parsed as `known`'s body with more items, or None if it is not one."""
    end = len(known.prefix)
    if len(raw) <= end or not raw.startswith(known.prefix):
        return None
    if known.items and raw[end] not in (_COMMA, _CLOSE):  # (none kept: the first is next)
        return None
    if 2 * len(raw) + 3 > 3 * max_values:  # every value of the body counts (loads' rule)
        if known.values is None:  # (its body less what follows the prefix: no copy of it)
            whole: bytes | bytearray = known.prefix.obj  # type: ignore[assignment]
            known.values = json_bounds.value_bound(whole) - json_bounds.value_bound(whole[end:])
        bound = known.values + json_bounds.value_bound(raw[end:])
        json_bounds.check_values(raw, max_values, bound)
    if raw[end] == _COMMA and known.items:
        after = _forward(raw, end + 1)
        if after >= len(raw) or raw[after] == _CLOSE:  # `,]`: no item after the comma
            return None
        tail = raw[end + 1 :]
    else:
        tail = raw[end:]
    try:
        value = json_bounds.loads(bytes(raw[: known.start]) + tail, max_values)
    except (orjson.JSONDecodeError, RequestError):
        return None  # the plain parse says why
    if value.__class__ is not dict or value.get("input").__class__ is not list:
        return None
    items = KnownInput(known.items, known.references)
    items.extend(value["input"])
    value["input"] = items
    return value


def input_span(
    raw: bytes | bytearray, value: dict[str, Any], after: int = 0, start: int | None = None
) -> tuple[int, int] | None:
    """(where the items of `value["input"]` start in `raw`, where its closing `]` is), or
    None where they cannot be found and proved (see the module): the candidates for the
    `]` from the end, for the `[` from the start (`start`: known already), a few of each.
    `after`: the `]` is at or past this offset (a body known to start with another)."""
    keys = list(value)
    rest = keys[keys.index("input") + 1 :]
    key = orjson.dumps(rest[0]) if rest else None
    expected = {**value, "input": []}
    for end in islice(_closings(raw, key, after), TRIES):
        starts = (start,) if start is not None else _openings(raw, end)
        for begin in islice(starts, TRIES):
            try:
                if orjson.loads(bytes(raw[:begin]) + raw[end:]) == expected:
                    return begin, end
            except orjson.JSONDecodeError:
                continue
    return None


def _closings(raw: bytes | bytearray, key: bytes | None, after: int) -> Iterator[int]:
    """Each `]` before `,` and `key` (the next member's name), from the end; the `]`
    before the closing `}` when `input` is the last member."""
    if key is None:
        at = _back(raw, len(raw) - 1)
        if at >= 0 and raw[at] == 0x7D:
            at = _back(raw, at - 1)
            if at >= after and raw[at] == _CLOSE:
                yield at
        return
    at = len(raw)
    while (at := raw.rfind(key, after, at)) >= 0:  # the name is in later members too
        comma = _back(raw, at - 1)
        if comma > after and raw[comma] == _COMMA:
            close = _back(raw, comma - 1)
            if close >= after and raw[close] == _CLOSE:
                yield close


def _openings(raw: bytes | bytearray, end: int) -> Iterator[int]:
    """Just past each `[` of `"input": [` before `end`, from the start."""
    at = 0
    while (at := raw.find(b'"input"', at, end)) >= 0:
        colon = _forward(raw, at + 7)
        if colon < end and raw[colon] == 0x3A:
            bracket = _forward(raw, colon + 1)
            if bracket < end and raw[bracket] == 0x5B:
                yield bracket + 1
        at += 7


def _back(raw: bytes | bytearray, at: int) -> int:
    while at >= 0 and raw[at] in _WHITESPACE:
        at -= 1
    return at


def _forward(raw: bytes | bytearray, at: int) -> int:
    while at < len(raw) and raw[at] in _WHITESPACE:
        at += 1
    return at


def _any_reference(items: list[Any]) -> bool:
    return any(map(is_reference, items))
