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
    splice into its events; every piece is non-empty and still becomes one event."""

    pieces: list[str]
    raw: list[bytes]


@dataclass(slots=True)
class ServiceTier:
    """The service tier the backend reports having served the request at."""

    tier: str


@dataclass(slots=True)
class ReasoningDelta:
    """A piece of raw reasoning (`reasoning_content` or `reasoning` in Chat chunks)."""

    text: str


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
    `TextRun` is for text: `arguments` is their join; each piece is non-empty."""

    pieces: list[str] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)


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
    """The backend failed after the stream started (or sent an error payload)."""

    code: str
    message: str


@dataclass(slots=True)
class WholeItem:
    """An output item made whole by the gateway (a compaction): added and done at once."""

    item: dict[str, Any]


@dataclass(slots=True)
class ForeignEvent:
    """An event type the gateway does not know, from a backend that streams Responses
    events: passed on as sent, with the gateway's `sequence_number`."""

    event: dict[str, Any]


Delta = (
    TextDelta
    | LoggedText
    | TextRun
    | ToolCallRun
    | ReasoningDelta
    | ReasoningBlob
    | RefusalDelta
    | ToolCallDelta
    | Finish
    | Usage
    | UpstreamError
    | WholeItem
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
        if delta.__class__ is TextRun:
            out += map(TextDelta, delta.pieces)
        elif delta.__class__ is ToolCallRun:
            index = delta.index
            out += [ToolCallDelta(index, None, None, p) for p in delta.pieces]
        else:
            out.append(delta)
    return out
