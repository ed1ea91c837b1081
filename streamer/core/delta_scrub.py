"""The output deltas of one stream, scrubbed of whole secrets per channel (pure).

Each output channel (the answer's text, reasoning, refusal, one tool call's arguments) is
one text for `PieceScrubber` (streamer/core/scrub.py): a delta is held back, as it came,
until the channel's next `window` characters have followed it, so a secret split across
deltas is still caught, and the deltas that leave are the backend's own, cut where it cut
them. Only a delta that held part of a whole secret changes: a run becomes one plain delta
of its new text, logged text loses the logprobs that spelt the secret. A delta of another
channel, or any other delta (a finish, usage, an error), first lets the held ones go: when
a delta leaves depends on lengths and order, never on what the text says.
"""

from __future__ import annotations

from typing import Any

from streamer.core.deltas import (
    Delta,
    LoggedText,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    TextRun,
    ToolCallDelta,
    ToolCallRun,
)
from streamer.core.scrub import PieceScrubber

_TEXT, _REASONING, _REFUSAL = -1, -2, -3  # channels; a tool call's is its index (>= 0)
_CHANNELS: dict[type, int] = {
    TextDelta: _TEXT,
    LoggedText: _TEXT,
    TextRun: _TEXT,
    ReasoningDelta: _REASONING,
    RefusalDelta: _REFUSAL,
}
_TOOLS = (ToolCallDelta, ToolCallRun)


def channel(delta: Delta) -> int | None:
    """The output channel `delta` belongs to; None: not output text."""
    if isinstance(delta, ToolCallDelta):  # a ToolCallRun too
        return delta.index
    return _CHANNELS.get(delta.__class__)


def _text(delta: Any) -> str:
    return delta.arguments if delta.__class__ in _TOOLS else delta.text


class DeltaScrubber:
    """`feed(batch)` -> the deltas that may leave now; `flush()` -> the rest (the stream's end)."""

    __slots__ = ("_channel", "_held", "_scrubber")

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._scrubber: PieceScrubber[str] = PieceScrubber(secrets)
        self._held: list[Delta] = []  # the deltas whose text the scrubber holds, in order
        self._channel: int | None = None

    @property
    def window(self) -> int:
        return self._scrubber.window

    def feed(self, batch: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        run: list[Delta] = []  # consecutive deltas of the current channel, fed at once
        for delta in batch:
            key = channel(delta)
            if key is not None and key == self._channel:
                run.append(delta)
                continue
            if run:
                self._feed(run, out)
                run = []
            out += self.flush()
            if key is None:
                out.append(delta)
            else:
                self._channel = key
                run.append(delta)
        if run:
            self._feed(run, out)
        return out

    def flush(self) -> list[Delta]:
        """The held deltas, as they are; the channel is over."""
        self._channel = None
        if not self._held:
            return []
        out: list[Delta] = []
        self._release(self._scrubber.flush(), out)
        return out

    def _feed(self, run: list[Delta], out: list[Delta]) -> None:
        """Hold `run` (one channel's deltas); what leaves goes to `out`."""
        held = self._held
        pieces: list[str] = []
        for delta in run:
            text = _text(delta)
            if text:
                held.append(delta)
                pieces.append(text)
            elif delta.__class__ is ToolCallDelta and (delta.id or delta.name):
                if not held:  # nothing before it waits: it leaves in its place
                    out.append(delta)
                elif not _text(held[-1]):  # one held already: take its id and name into it
                    last: Any = held[-1]
                    last.id, last.name = last.id or delta.id, last.name or delta.name
                else:
                    held.append(delta)
                    pieces.append("")
            # an empty text delta carries nothing: dropped
        if pieces:
            self._release(self._scrubber.feed(pieces), out)

    def _release(self, texts: list[str], out: list[Delta]) -> None:
        """The first `len(texts)` held deltas to `out`, each with its text as scrubbed."""
        held = self._held
        for i, text in enumerate(texts):
            delta = held[i]
            if text is _text(delta):
                out.append(delta)
            elif (changed := _rewritten(delta, text)) is not None:
                out.append(changed)
        del held[: len(texts)]


def _rewritten(delta: Any, text: str) -> Delta | None:
    """`delta` with `text` for its own (None: nothing of it is left to send)."""
    cls = delta.__class__
    if cls in _TOOLS:
        if not (text or delta.id or delta.name):
            return None
        return ToolCallDelta(delta.index, delta.id, delta.name, text)
    if not text:
        return None
    if cls is TextRun:
        return TextDelta(text)
    if cls is LoggedText:
        return LoggedText(text, [])  # its tokens spelt what was taken out
    out: Delta = cls(text)
    return out
