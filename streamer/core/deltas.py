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
