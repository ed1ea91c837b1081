"""Client JSON parsed within what the gateway can afford, and can serialise again (pure).

`loads` is `orjson.loads` with two bounds, each checked before or during the parse with
C-speed passes, never by a walk of the parsed value:

- **Depth.** orjson parses arrays and objects nested 1,024 deep (`PARSEABLE_DEPTH`) but
  serialises only 254 (`SERIALISABLE_DEPTH`), and the gateway serialises parts of every
  body again: the Chat request, the Response's echo, events, the store, `--tap-dir` lines.
  A body nested deeper than `MAX_DEPTH` (the serialiser's limit less `WRAPPING`, the levels
  the gateway may put around a client value when it serialises it) is a 400 naming the
  path to the first container too deep, instead of a 500 wherever it is serialised. Short
  bodies cannot be that deep; mid-sized ones are serialised once (`orjson.dumps`, the
  serialiser itself is the check) under `WRAPPING` levels; long ones are parsed once under
  `PARSEABLE_DEPTH - MAX_DEPTH` levels of `[` so that the parser itself refuses the depth
  (a fixed ~50 µs instead of a serialisation that grows with the body).
- **Values.** A small body can hold many cheap-to-send, costly-to-build values (27 MB of
  `[{},{},…]` is 9 M dicts, ~900 MB). A body of n bytes holds at most 1 + 2n/3 values as
  `value_count` counts them, so one of up to 1.5 times the cap in bytes is never counted;
  a longer one is bounded by its `,`, `[` and `{` bytes (one translate), and counted
  exactly (outside strings) only when that bound is over the cap. Past the cap: a 400,
  before anything is parsed.

`deep_path` and `value_count` are the exact answers the fast checks bound (read only on
the way to a 400). A backend's JSON that the gateway passes on (an output item, an event,
a call's arguments) must fit `MAX_ITEM_DEPTH`, so that a client can send it back:
`too_deep` checks a value parsed already, `loads_within` parses one.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from streamer.core.errors import RequestError, invalid

PARSEABLE_DEPTH = 1024  # orjson.loads: "depth limit exceeded" beyond
SERIALISABLE_DEPTH = 254  # orjson.dumps: "Recursion limit reached" beyond
# The levels the gateway may nest a client value in when it serialises it: 2 today (a
# `--tap-dir` line around the Chat request, whose `function` wraps a tool's parameters),
# the rest room for more. tests/hostile/test_hostile_json.py sends MAX_DEPTH everywhere.
WRAPPING = 14
MAX_DEPTH = SERIALISABLE_DEPTH - WRAPPING
# An output item (or event) from a backend: what a client may send back in `input`.
MAX_ITEM_DEPTH = MAX_DEPTH - 2
MAX_VALUES = 1_000_000  # --max-json-values: ~70-100 MB and ~0.1 s of parsing at most

_SHORT = 2 * (MAX_DEPTH + 1)  # below this many bytes (or characters) no body is too deep
_WRAP_FROM = 256 * 1024  # from here the wrapped parse costs less than a serialisation
_WRAPPERS = PARSEABLE_DEPTH - MAX_DEPTH
_OPEN, _CLOSE = b"[" * _WRAPPERS, b"]" * _WRAPPERS
_OPEN_STR, _CLOSE_STR = "[" * _WRAPPERS, "]" * _WRAPPERS
# every byte but the three that precede a value: `,` (the next one) and `[`, `{` (a container)
_NOT_BEFORE_VALUE = bytes(c for c in range(256) if c not in b",[{")
_CHUNK = 64 * 1024  # value_count's piece of the body
_TOKENS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{}]', re.DOTALL)
_PATH_CHARS = 256  # a path longer than this is cut (a body can nest thousands of long keys)

Raw = bytes | bytearray | memoryview | str


def loads(raw: Raw, max_values: int = MAX_VALUES) -> Any:
    """`raw` parsed, or a 400 if it is too costly (`max_values`) or too deep (`MAX_DEPTH`).

    Invalid JSON raises `orjson.JSONDecodeError`, as from `orjson.loads` (the caller says
    what was not valid)."""
    n = len(raw)
    if 2 * n + 3 > 3 * max_values:  # else it cannot hold more (`value_count`: <= 1 + 2n/3)
        check_values(raw, max_values)
    if n <= _SHORT:
        return orjson.loads(raw)
    if n < _WRAP_FROM:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _depth_error(raw, exc) from None
        if too_deep(value, MAX_DEPTH):
            raise _deep(raw)
        return value
    return _wrapped(raw)


def _wrapped(raw: Raw) -> Any:
    """The parse of a long body under `_WRAPPERS` levels of `[`: the parser refuses the
    depth. Each level must hold one element, or `raw` was not one JSON value (`1],[2`);
    any failure is parsed again plainly, for the error a plain parse gives."""
    try:
        if isinstance(raw, str):
            value = orjson.loads(_OPEN_STR + raw + _CLOSE_STR)
        else:
            value = orjson.loads(b"".join((_OPEN, raw, _CLOSE)))
    except orjson.JSONDecodeError as exc:
        if "depth" in exc.msg:
            raise _deep(raw) from None
        return orjson.loads(raw)  # raises, as a plain parse does
    for _ in range(_WRAPPERS):
        if len(value) != 1:
            return orjson.loads(raw)  # raises: not one value
        value = value[0]
    return value


def _depth_error(raw: Raw, exc: orjson.JSONDecodeError) -> Exception:
    """Past the parser's own depth a too-deep error; any other decode error as it is."""
    if "depth" in exc.msg and deep_path(raw, MAX_DEPTH) is not None:
        return _deep(raw)
    return exc


def too_deep(value: Any, limit: int) -> bool:
    """Whether parsed JSON `value` nests arrays and objects more than `limit` (at most
    `SERIALISABLE_DEPTH`) levels: one serialisation, under `SERIALISABLE_DEPTH - limit`
    levels of lists."""
    for _ in range(SERIALISABLE_DEPTH - limit):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def loads_within(data: Raw, limit: int = MAX_ITEM_DEPTH) -> Any:
    """`orjson.loads` of JSON the gateway will serialise again inside its own (a model's
    tool arguments): nested deeper than `limit`, it raises `orjson.JSONDecodeError` as
    JSON that could not be read does, so that it takes the same way out."""
    value = orjson.loads(data)
    if value.__class__ in (dict, list) and too_deep(value, limit):
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
        raise orjson.JSONDecodeError(f"nested deeper than {limit} levels", text, 0)
    return value


def _deep(raw: Raw) -> RequestError:
    path = deep_path(raw, MAX_DEPTH) or ""
    if len(path) > _PATH_CHARS:
        path = path[:_PATH_CHARS] + "…"
    where = f" at '{path}'" if path else ""
    return invalid(
        f"The JSON of your request is nested too deeply{where}: at most {MAX_DEPTH} levels "
        "of arrays and objects are supported.",
        path or None,
        "json_too_deep",
    )


def deep_path(raw: Raw, limit: int) -> str | None:
    """The `param` path of the first array or object nested deeper than `limit` in `raw`,
    or None if there is none (`""`: the body itself). Reads only up to it, a bracket or a
    string at a time (the commas between are counted in C): the exact answer, for a 400."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    stack: list[list[Any]] = []  # per open container: [is_object, key or index, wants_key]
    at = 0
    for match in _TOKENS.finditer(data):
        start = match.start()
        if stack and start > at and (commas := data.count(b",", at, start)):
            top = stack[-1]
            if top[0]:
                top[2] = True  # the next string is a key
            else:
                top[1] += commas
        at = match.end()
        head = data[start]
        if head == 0x22:  # a string: a key if the object waits for one
            if stack and stack[-1][2]:
                stack[-1][1:] = orjson.loads(match.group()), False
        elif head in b"[{":
            if len(stack) == limit:
                return _joined(stack)
            stack.append([head == 0x7B, 0 if head == 0x5B else "", head == 0x7B])
        elif stack:
            stack.pop()
    return None


def _joined(stack: list[list[Any]]) -> str:
    parts = [f"[{at}]" if not is_object else f".{at}" if i else at
             for i, (is_object, at, _) in enumerate(stack)]  # fmt: skip
    return "".join(parts)


def value_bound(data: bytes | bytearray) -> int:
    """The `,`, `[` and `{` bytes of `data`: one less than the most JSON values it holds
    (`check_values`' first bound; it adds up over the pieces of a body)."""
    return len(data.translate(None, _NOT_BEFORE_VALUE))


def check_values(raw: Raw, max_values: int, bound: int | None = None) -> None:
    """A 400 if `raw` holds more than `max_values` JSON values (see `value_count`): the
    byte bound first (`bound`: it, worked out already), the exact count only when the
    bound is over."""
    if isinstance(raw, str):
        data: bytes | bytearray = raw.encode()
    else:
        data = raw if isinstance(raw, bytes | bytearray) else bytes(raw)
    if (value_bound(data) if bound is None else bound) + 1 <= max_values:
        return
    count = value_count(bytes(data))
    if count > max_values:
        raise invalid(
            f"The JSON of your request holds {count:,} values; at most {max_values:,} are "
            "supported in one request (--max-json-values).",
            None,
            "too_many_json_values",
        )


def value_count(data: bytes) -> int:
    """The JSON values in `data`, each empty array or object counting two (object keys are
    not counted): one more than the `,`, `[` and `{` outside strings, as every value but
    the first follows a comma or opens a container.

    Strings are found by their quotes once the escapes are cut out (an escape never ends
    a string), a chunk at a time, so that a body of a million tiny strings costs a split
    of each chunk, not a million objects at once. Exact for valid JSON; for invalid JSON
    at least what a parse builds before it fails (both read strings alike up to there)."""
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    count, inside = 1, 0
    for at in range(0, len(data), _CHUNK):
        pieces = data[at : at + _CHUNK].split(b'"')
        count += len(b"".join(pieces[inside::2]).translate(None, _NOT_BEFORE_VALUE))
        inside ^= (len(pieces) & 1) ^ 1  # an odd number of quotes: the next chunk flips
    return count
