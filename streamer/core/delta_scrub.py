"""The output deltas of one stream, scrubbed of whole secrets per channel (pure).

Each output channel (the answer's text, reasoning, refusal, one tool call's arguments) is
one text, scrubbed as streamer/core/scrub.py says: a delta is held back, as it came, until
no secret that could start in it can still be incomplete (the channel's open token run at
its end, at most the window, has come after it), so a secret split across deltas is still
caught, and the deltas that leave are the backend's own, cut where it cut them. Only a delta that held part of a whole secret changes: a run becomes one plain delta
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
from streamer.core.scrub import redact_pieces, token_chars, window

_TEXT, _REASONING, _REFUSAL = -1, -2, -3  # channels; a tool call's is its index (>= 0)
_CHANNELS: dict[type, int] = {
    TextDelta: _TEXT,
    LoggedText: _TEXT,
    TextRun: _TEXT,
    ReasoningDelta: _REASONING,
    RefusalDelta: _REFUSAL,
}
_TOOLS = (ToolCallDelta, ToolCallRun)


class DeltaScrubber:
    """`feed(batch)` -> the deltas that may leave now; `flush()` -> the rest (the stream's end)."""

    __slots__ = ("_channel", "_held", "_secrets", "_text", "_texts", "_tokens", "window")

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = secrets
        self.window = window(secrets)  # the most that waits: the longest secret less one
        self._tokens = token_chars(secrets)  # what a key is made of (None: not a token)
        self._held: list[Delta] = []  # the current channel's deltas that wait, in order
        self._texts: list[str] = []  # their texts, as they now read
        self._text = ""  # those, joined
        self._channel: int | None = None

    def feed(self, batch: list[Delta]) -> list[Delta]:
        """The deltas of `batch` (and held before) that may leave now, in order. (Once per
        read: each delta's channel is told here; its channel's text is scrubbed and what may
        leave found once per batch.)"""
        out: list[Delta] = []
        held, texts = self._held, self._texts
        current = self._channel
        for delta in batch:
            cls = delta.__class__
            tool = cls is ToolCallDelta or cls is ToolCallRun
            key = delta.index if tool else _CHANNELS.get(cls)  # type: ignore[union-attr]
            if key is None or key != current:
                if held:
                    self._settle(out, True)  # the channel is over: what waited leaves
                current = key
                if key is None:
                    out.append(delta)
                    continue
            text: str = delta.arguments if tool else delta.text  # type: ignore[union-attr]
            if text:
                held.append(delta)
                texts.append(text)
                self._text += text
            elif cls is ToolCallDelta and (delta.id or delta.name):  # type: ignore[union-attr]
                self._empty(delta, out)  # type: ignore[arg-type]
            # an empty text delta carries nothing: dropped
        self._channel = current
        if held:
            self._settle(out, False)
        return out

    def flush(self) -> list[Delta]:
        """The held deltas, scrubbed and otherwise as they are; the channel is over."""
        out: list[Delta] = []
        if self._held:
            self._settle(out, True)
        self._channel = None
        return out

    def _settle(self, out: list[Delta], end: bool) -> None:
        """Whole secrets out of the waiting text; to `out`, the deltas that need not wait
        (all of them at the `end` of the channel)."""
        text = self._text
        texts = self._texts
        for secret in self._secrets:
            if secret in text:
                texts[:], text = redact_pieces(texts, text, self._secrets)
                break
        n = len(texts)
        waiting = 0
        if not end:  # the fewest deltas at the end that hold what must wait (held_back)
            tail = text[-self.window :]
            tokens = self._tokens
            wait = len(tail) - len(tail.rstrip(tokens)) if tokens is not None else len(tail)
            while n and waiting < wait:
                n -= 1
                waiting += len(texts[n])
        held = self._held
        for i in range(n):
            delta, now = held[i], texts[i]
            if now is (delta.arguments if delta.__class__ in _TOOLS else delta.text):  # type: ignore[union-attr]
                out.append(delta)
            elif (changed := _rewritten(delta, now)) is not None:
                out.append(changed)
        del held[:n], texts[:n]
        self._text = text[len(text) - waiting :] if waiting else ""

    def _empty(self, delta: ToolCallDelta, out: list[Delta]) -> None:
        """A call's id or name with no arguments: it leaves in its place when nothing before
        it waits; else it waits too, folded into the last held delta if that is one too."""
        held = self._held
        if not held:
            out.append(delta)
        elif not self._texts[-1]:
            last: Any = held[-1]
            last.id, last.name = last.id or delta.id, last.name or delta.name
        else:
            held.append(delta)
            self._texts.append("")


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
