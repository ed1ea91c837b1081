"""The pieces `OutputItemStreamer` assembles output items from (pure).

Open parts, items and buffered tool calls, part shapes, and the failure codes clients act
on; a call's item is its kind's row (streamer/core/call_kinds.py).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import orjson

from streamer.core.events import Event

_new = tuple.__new__  # Event's C-level constructor (see output.py)


# Finish reasons that end the response `incomplete`, and the reason they report.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# The reason a response cut by the gateway's own output limits reports: the closest the
# spec has (the SDK's `incomplete_details.reason` is a closed set).
LIMIT_REASON = "max_output_tokens"


class OutputLimits:
    """What one backend answer may make a turn hold: characters of output, output items.

    Characters are counted as decoded (text, reasoning, refusal, tool call ids, names and
    arguments): what the gateway keeps in memory, and the size of the answer for ASCII.
    """

    __slots__ = ("max_chars", "max_items")

    def __init__(self, max_chars: int = 16 * 1024 * 1024, max_items: int = 2048) -> None:
        self.max_chars = max_chars
        self.max_items = max_items


class DeltaTemplate:
    """The one encoder of a delta event type on one item: `{...,"delta":…,"sequence_number":…}`.

    A delta event differs from the next only in `delta` and `sequence_number`, so the rest
    is encoded once, by orjson from the plain event dict, and each delta is one bytes format
    away (0.18 vs 1.32 µs for `orjson.dumps` of the whole dict; tests/test_delta_template.py
    checks the bytes against that dict's).
    """

    __slots__ = ("_prefix", "type")

    def __init__(self, event_type: str, where: dict[str, Any]) -> None:
        self.type = event_type
        # `{"type":…,<where>,"delta":0}` without its `0}`: the prefix as orjson writes it.
        self._prefix = orjson.dumps({"type": event_type, **where, "delta": 0})[:-2]

    def encode(self, delta: str, seq: int) -> bytes:
        """The event's JSON, with `sequence_number` last, as `orjson.dumps` of the dict."""
        return b'%s%s,"sequence_number":%d}' % (self._prefix, orjson.dumps(delta), seq)

    def run(self, raw: list[bytes], seq: int) -> list[Event]:
        """One event per piece of a run, numbered from `seq`: each piece's JSON string
        contents as the backend sent them (validated by the decoder, runs.py), spliced in
        where `encode` puts `orjson.dumps` of the decoded piece: the same JSON, parsed."""
        seqs = range(seq, seq + len(raw))
        prefix = self._prefix + b'"'
        datas = [
            b'%s%s","sequence_number":%d}' % (prefix, r, s) for r, s in zip(raw, seqs, strict=True)
        ]
        return list(map(_new, repeat(Event), zip(repeat(self.type), datas, seqs)))


class Part:
    """The open content part of a message or reasoning item."""

    __slots__ = ("annotations", "delta", "index", "kind", "logprobs", "text", "where")

    def __init__(
        self, kind: str, index: int, delta_type: str, item_id: str, output_index: int
    ) -> None:
        self.kind = kind  # output_text | refusal | reasoning_text | summary_text
        self.index = index
        self.where: dict[str, Any] = {
            "item_id": item_id,
            "output_index": output_index,
            ("summary_index" if kind == "summary_text" else "content_index"): index,
        }
        self.logprobs: list[dict[str, Any]] = []  # the tokens' logprobs, when asked for
        self.annotations: list[dict[str, Any]] = []  # an output_text's citations, in order
        where = {**self.where, "logprobs": []} if kind == "output_text" else self.where
        self.delta = DeltaTemplate(delta_type, where)
        self.text = TextBuffer()


class TextBuffer:
    """The text of a part so far, compact while thousands of small deltas arrive.

    A list of the deltas (or a StringIO, which keeps them the same way until read)
    costs ~60 bytes of object per delta and holds them all: 126 kB for a 15 kB answer of
    2,000 deltas, with many streams open at once. Here the recent deltas wait in
    `pieces`, joined into one string each time there are `JOIN` of them: ~17 kB for that
    answer, each character copied once.
    """

    __slots__ = ("_joined", "pieces")
    JOIN = 64

    def __init__(self) -> None:
        self._joined: list[str] = []
        self.pieces: list[str] = []

    def write(self, text: str) -> None:
        pieces = self.pieces
        pieces.append(text)
        if len(pieces) >= self.JOIN:
            self._joined.append("".join(pieces))
            pieces.clear()

    def getvalue(self) -> str:
        return "".join(self._joined + self.pieces)


class Item:
    """The open message or reasoning item."""

    __slots__ = ("id", "item", "output_index", "part")

    def __init__(self, item: dict[str, Any], output_index: int) -> None:
        self.item = item
        self.id: str = item["id"]
        self.output_index = output_index
        self.part: Part | None = None


class Call:
    """One backend tool call, accumulated by its backend index."""

    __slots__ = ("args", "call_id", "delta", "emitted", "index", "item", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.call_id: str | None = None
        self.name = ""
        self.args: list[str] = []
        self.item: dict[str, Any] | None = None  # set once output_item.added went out
        self.delta: DeltaTemplate | None = None  # set while its arguments stream live
        self.emitted = False  # output_item.done went out


def empty_part(kind: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    if kind == "refusal":
        return {"type": "refusal", "refusal": ""}
    return {"type": kind, "text": ""}  # reasoning_text, summary_text


def new_item(item_type: str, make_id: Callable[[str], str]) -> dict[str, Any]:
    """A message or reasoning item as `output_item.added` shows it."""
    if item_type == "message":
        return {
            "id": make_id("msg"),
            "type": "message",
            "status": "in_progress",
            "content": [],
            "role": "assistant",
        }
    return {
        "id": make_id("rs"),
        "type": "reasoning",
        "status": "in_progress",
        "summary": [],
        "content": [],
    }


def part_done(
    kind: str,
    text: str,
    logprobs: list[dict[str, Any]] | None = None,
    annotations: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished part's `*.done` event (without its location) and the part itself;
    an output_text part carries its tokens' `logprobs` (the done event and the part alike,
    `bytes` included: Open Responses requires them; the SDK's event type ignores them) and
    its `annotations`."""
    if kind == "output_text":
        entries = logprobs or []
        done = {"type": "response.output_text.done", "text": text, "logprobs": entries}
        part = {
            "type": "output_text",
            "text": text,
            "annotations": annotations or [],
            "logprobs": entries,
        }
        return done, part
    if kind == "refusal":
        return {"type": "response.refusal.done", "refusal": text}, {
            "type": "refusal",
            "refusal": text,
        }
    if kind == "summary_text":
        return {"type": "response.reasoning_summary_text.done", "text": text}, {
            "type": "summary_text",
            "text": text,
        }
    return {"type": "response.reasoning_text.done", "text": text}, {
        "type": "reasoning_text",
        "text": text,
    }


SUMMARIES = ("auto", "concise", "detailed")
"""The `reasoning.summary` values a request may ask for (a Responses backend then sends its
summary parts; a Chat backend has none to send)."""
