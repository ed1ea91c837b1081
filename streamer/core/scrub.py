"""Secrets out of what the backend says: whole secrets only, held back by position (pure).

A backend may echo a key it was sent, and a client may make the model repeat what it likes.
So the rule is that nothing a client sees (bytes, where deltas start and end, when they
leave, a `[redacted]` marker) may depend on a *partial* match of a secret, or the scrubber
is an oracle that teaches the key character by character:

- Only a whole secret is replaced (by `REDACTED`). A piece of one is not a secret; it is
  passed on as it came.
- A stream is scrubbed as one text, so a secret split across pieces is still one secret:
  what leaves is what `window` more characters have followed (the longest secret's length
  less one: by then any secret that starts in it is complete), a piece kept whole
  (`PieceScrubber`, for deltas) or cut where the window starts (`StreamScrubber`, for
  bytes). When something leaves depends only on lengths, never on what it says; the end
  of the stream lets the rest go as it is (a piece of a secret is not a secret).
- Backend text that the gateway quotes in its own words is scrubbed before it is cut to
  length (`excerpt`): cut first, a secret across the cut could no longer be found.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Iterable, Mapping
from typing import AnyStr, Generic

REDACTED = "[redacted]"
MIN_SECRET = 4  # shorter strings would mangle ordinary text and protect nothing
FRAGMENT = 8  # runs of a secret this long are taken out of recordings (only)


def secrets_of(values: Iterable[str | None]) -> tuple[str, ...]:
    """The distinct secrets worth scrubbing, longest first (a key may contain another)."""
    found = {v for v in values if v and len(v) >= MIN_SECRET}
    return tuple(sorted(found, key=lambda v: (-len(v), v)))


def bearer_token(headers: Mapping[str, str] | None) -> str | None:
    """The token of a forwarded `Authorization: Bearer …` header (else its whole value)."""
    for key, value in (headers or {}).items():
        if key.lower() == "authorization":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else value
    return None


def window(secrets: tuple[str, ...] | tuple[bytes, ...]) -> int:
    """How much of a stream is held back: the longest secret less one character."""
    return max(map(len, secrets)) - 1


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every whole secret replaced (longest first)."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub_bytes(data: bytes, secrets: tuple[str, ...]) -> bytes:
    for secret in secrets:
        raw = secret.encode()
        if raw in data:
            data = data.replace(raw, REDACTED.encode())
    return data


def excerpt(raw: AnyStr, limit: int, secrets: tuple[str, ...]) -> AnyStr:
    """At most `limit` characters (bytes) of backend text for a gateway message to quote:
    whole secrets taken out first, then cut."""
    if isinstance(raw, bytes):
        return scrub_bytes(raw, secrets)[:limit]
    return scrub(raw, secrets)[:limit]


def fragment_spans(text: AnyStr, secrets: tuple[AnyStr, ...]) -> list[tuple[int, int]]:
    """The [start, end) spans of `text` covered by runs of `FRAGMENT` characters of a
    secret, merged and in order: only for what no client sees (a recording), since what is
    taken out then depends on partial matches."""
    covered: list[tuple[int, int]] = []
    for secret in secrets:
        for i in range(len(secret) - FRAGMENT + 1):
            run = secret[i : i + FRAGMENT]
            at = text.find(run)
            while at >= 0:
                covered.append((at, at + FRAGMENT))
                at = text.find(run, at + 1)
    covered.sort()
    merged: list[tuple[int, int]] = []
    for start, end in covered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


@functools.lru_cache(maxsize=64)  # one per set of secrets, not one per stream
def _pattern(secrets: tuple[AnyStr, ...]) -> re.Pattern[AnyStr]:
    """Any of `secrets`, the longest first where several start at one place."""
    ordered = sorted(secrets, key=len, reverse=True)
    bar: AnyStr = b"|" if isinstance(ordered[0], bytes) else "|"
    return re.compile(bar.join(map(re.escape, ordered)))


class StreamScrubber(Generic[AnyStr]):
    """One stream of text (or bytes), scrubbed of whole secrets as one text, cut by position:
    `feed(piece)` returns all but the last `window` characters of what came so far (less
    what left before), `flush` the rest, as it is. For a stream whose pieces need not stay
    whole: the raw bytes of a recording, which no client reads, and where `fragments` also
    takes out every run of `FRAGMENT` characters of a secret (in raw bytes, a key the
    backend split across deltas is never whole).
    """

    __slots__ = ("_fragments", "_redacted", "_secrets", "_text", "window")

    def __init__(self, secrets: tuple[AnyStr, ...], *, fragments: bool = False) -> None:
        self._secrets: tuple[AnyStr, ...] = secrets
        self._fragments = fragments
        self.window = window(secrets)
        self._redacted: AnyStr = _marker(secrets[0])
        self._text: AnyStr = secrets[0][:0]  # what is held back

    def feed(self, piece: AnyStr) -> AnyStr:
        text = self._text + piece
        for secret in self._secrets:
            if secret in text:
                text = _pattern(self._secrets).sub(self._redacted, text)
                break
        cut = len(text) - self.window
        if cut <= 0:
            self._text = text
            return text[:0]
        if self._fragments:
            return self._cut_fragments(text, cut)
        self._text = text[cut:]
        return text[:cut]

    def flush(self) -> AnyStr:
        text, self._text = self._text, self._text[:0]
        if self._fragments and text:
            return self._cut_fragments(text, len(text))
        return text

    def _cut_fragments(self, text: AnyStr, cut: int) -> AnyStr:
        """`text[:cut]` leaves with every run of a secret that starts in it taken out (such a
        run is whole by now; one that reaches past `cut` takes that part of the rest too)."""
        parts: list[AnyStr] = []
        last = 0
        for start, end in fragment_spans(text, self._secrets):
            if start >= cut:
                break
            parts += (text[last:start], self._redacted)
            last = end
        cut = max(cut, last)
        parts.append(text[last:cut])
        self._text = text[cut:]
        return text[:0].join(parts)


class PieceScrubber(Generic[AnyStr]):
    """One stream of pieces, scrubbed of whole secrets as one text, each piece kept whole.

    `feed(pieces)` returns the pieces that may leave now, in order, one for each piece fed
    (the same object when it is unchanged; a piece that held part of a secret is changed:
    the marker where the secret starts, nothing of the rest of it). A piece leaves once
    `window` characters have followed it; `flush` lets the rest go, as they are.
    """

    __slots__ = ("_held", "_redacted", "_secrets", "_text", "window")

    def __init__(self, secrets: tuple[AnyStr, ...]) -> None:
        self._secrets: tuple[AnyStr, ...] = secrets
        self.window = window(secrets)
        self._redacted: AnyStr = _marker(secrets[0])
        self._held: deque[AnyStr] = deque()
        self._text: AnyStr = secrets[0][:0]  # the held pieces, joined

    @property
    def held(self) -> int:
        """How many pieces are held back."""
        return len(self._held)

    def feed(self, pieces: list[AnyStr]) -> list[AnyStr]:
        self._held.extend(pieces)
        text = self._text + (pieces[0] if len(pieces) == 1 else self._text[:0].join(pieces))
        for secret in self._secrets:
            if secret in text:
                text = self._redact(text)  # a new deque of held pieces
                break
        held = self._held
        out: list[AnyStr] = []
        rest = len(text)
        limit = self.window
        while held and rest - len(held[0]) >= limit:
            piece = held.popleft()
            rest -= len(piece)
            out.append(piece)
        self._text = text[len(text) - rest :] if out else text
        return out

    def flush(self) -> list[AnyStr]:
        out = list(self._held)
        self._held.clear()
        self._text = self._text[:0]
        return out

    def _redact(self, text: AnyStr) -> AnyStr:
        """The held pieces with every whole secret in `text` (their join) taken out."""
        spans = [m.span() for m in _pattern(self._secrets).finditer(text)]
        pieces: list[AnyStr] = []
        start = 0
        for piece in self._held:
            end = start + len(piece)
            pieces.append(_cut(piece, text, start, end, spans, self._redacted))
            start = end
        self._held = deque(pieces)
        return text[:0].join(pieces)


def _marker(like: AnyStr) -> AnyStr:
    return REDACTED.encode() if isinstance(like, bytes) else REDACTED


def _cut(
    piece: AnyStr, text: AnyStr, start: int, end: int, spans: list[tuple[int, int]], mark: AnyStr
) -> AnyStr:
    """`piece` (`text[start:end]`) without the parts of `spans` in it, the marker where one
    starts; `piece` itself when no span touches it."""
    parts: list[AnyStr] = []
    at = start
    for s, e in spans:
        if e <= start or s >= end:
            continue
        if s >= start:
            parts += (text[at:s], mark)
        at = min(e, end)
    if not parts and at == start:
        return piece
    parts.append(text[at:end])
    return text[:0].join(parts)
