"""The small vocabulary every upstream is normalised into.

An upstream decoder (Chat Completions today) turns the backend's chunks into these;
`OutputItemStreamer` turns them into Responses events. Nothing else crosses that line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class TextDelta:
    """A piece of the assistant's visible answer."""

    text: str


@dataclass(slots=True)
class LoggedText(TextDelta):
    """A piece of the answer with the log probabilities of its tokens (asked for with
    `top_logprobs` / `include: ["message.output_text.logprobs"]`), each in the Responses
    shape: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.

    A class of its own, so that plain text keeps the streamer's per-token path."""

    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class TextRun(TextDelta):
    """Consecutive pieces of the answer from one read, decoded together: `text` is their
    join, so a consumer that knows only `TextDelta` sees the same text. `raw` holds each
    piece as the backend encoded it (JSON string contents, validated), for the streamer to
    splice into its events; every piece is non-empty and still becomes one event.

    A run and `ToolCallRun` share one interface, all a consumer needs of either: `pieces`,
    `raw`, `joined()` (their join) and `piece(text)` (the plain delta of one piece)."""

    pieces: list[str]
    raw: list[bytes]

    def joined(self) -> str:
        return self.text

    def piece(self, text: str) -> TextDelta:
        return TextDelta(text)


@dataclass(slots=True)
class ServiceTier:
    """The service tier the backend reports having served the request at."""

    tier: str


@dataclass(slots=True)
class ReasoningDelta:
    """A piece of reasoning: raw (`reasoning_content` or `reasoning` in Chat chunks, a
    Responses backend's `reasoning_text`), or the summary part the last `ReasoningPart`
    named."""

    text: str


@dataclass(slots=True)
class ReasoningPart:
    """Where the reasoning text that follows goes: the backend's summary part
    `summary_index`, or (None) the raw reasoning, the item's `reasoning_text` content.

    Only a change starts a new part; a decoder sends one when the backend's part changes
    (Chat backends stream raw reasoning only and never send one). Text only, never part of
    a text delta: the scrubber and the per-token paths see plain `ReasoningDelta`s."""

    summary_index: int | None = None


@dataclass(slots=True)
class Annotation:
    """An annotation (a `url_citation`, ...) of the answer text streamed so far, in the
    Responses shape (`{type: "url_citation", url, title, start_index, end_index}`)."""

    annotation: dict[str, Any]


@dataclass(slots=True)
class ReasoningBlob:
    """A Responses backend's own `encrypted_content` for the reasoning it just streamed:
    kept sealed inside the gateway's own (when the client asked for it), never shown."""

    encrypted_content: str


@dataclass(slots=True)
class RefusalDelta:
    """A piece of a refusal (`refusal` in Chat chunks)."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A fragment of one tool call, keyed by the backend's `index`.

    `id` and `name` arrive on the first fragment(s); `name` may itself be split
    across fragments, so consumers concatenate it until arguments start.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ToolCallRun(ToolCallDelta):
    """Consecutive argument fragments of one call (no id, no name) decoded together, as
    `TextRun` is for text (and with its interface): `arguments` is their join; each piece
    is non-empty."""

    pieces: list[str] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def joined(self) -> str:
        return self.arguments

    def piece(self, text: str) -> ToolCallDelta:
        return ToolCallDelta(self.index, None, None, text)


@dataclass(slots=True)
class Finish:
    """The backend's finish reason: `stop`, `length`, `tool_calls`, `content_filter`, …"""

    reason: str


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class UpstreamError:
    """The backend failed after the stream started (or sent an error payload); `type` is
    the backend's own error type, when it gave one."""

    code: str
    message: str
    type: str | None = None


@dataclass(slots=True)
class WholeItem:
    """An output item passed whole: made by the gateway (a compaction), or a backend's item
    the gateway does not stream (a hosted call), `key` naming it as `ItemAdded` did (None:
    none was). Done now, added first unless `ItemAdded` opened it."""

    item: dict[str, Any]
    key: Any = None


@dataclass(slots=True)
class ItemAdded:
    """A backend's item passed whole is added (its `output_item.added`): opened under the
    gateway's id, so that its own events (`ForeignEvent`s with its `key`) follow it live,
    until its `WholeItem`."""

    item: dict[str, Any]
    key: Any


CURRENT = "<the item streaming now>"
"""`ForeignEvent.key` of an event about an item the gateway streams itself (a message, a
reasoning item, a call): it names the item the gateway has open."""


@dataclass(slots=True)
class ForeignEvent:
    """An event type the gateway does not know, from a backend that streams Responses
    events: passed on as sent, with the gateway's `sequence_number`, and, when it is about an
    item (`key`: the backend's, or `CURRENT`), the gateway's `item_id` and `output_index`
    of that item, after its `output_item.added` (held until then)."""

    event: dict[str, Any]
    key: Any = None


Delta = (
    TextDelta
    | LoggedText
    | TextRun
    | ToolCallRun
    | ReasoningDelta
    | ReasoningPart
    | Annotation
    | ReasoningBlob
    | RefusalDelta
    | ToolCallDelta
    | Finish
    | Usage
    | UpstreamError
    | WholeItem
    | ItemAdded
    | ForeignEvent
    | ServiceTier
)


RUNS = (TextRun, ToolCallRun)


def expand(deltas: list[Delta]) -> list[Delta]:
    """`deltas` with every run replaced by its pieces, one plain delta each (what the
    decoder gives with runs off): for consumers that look at single pieces."""
    if not any(d.__class__ is TextRun or d.__class__ is ToolCallRun for d in deltas):
        return deltas
    out: list[Delta] = []
    for delta in deltas:
        if delta.__class__ is TextRun or delta.__class__ is ToolCallRun:
            out += map(delta.piece, delta.pieces)
        else:
            out.append(delta)
    return out
