"""Secrets out of what the backend says: whole secrets only, held back by position (pure).

A backend may echo a key it was sent, and a client may make the model repeat what it likes.
So the rule is that nothing a client sees (bytes, where deltas start and end, when they
leave, a `[redacted]` marker) may depend on a *partial* match of a secret, or the scrubber
is an oracle that teaches the key character by character:

- Only a whole secret is replaced (by `REDACTED`). A piece of one is not a secret; it is
  passed on as it came.
- A stream is scrubbed as one text, so a secret split across pieces is still one secret:
  its end is held back until any secret that could start in what leaves is complete, a
  piece kept whole (streamer/core/delta_scrub.py, for deltas) or cut there
  (`StreamScrubber`, for bytes). How much waits (`held_back`) is the open run of token characters at the end (a
  key is a token: `TOKEN`, RFC 7235's token68, so one lies inside such a run), at most
  `window`, the longest secret's length less one (all of it, for a secret that is not a
  token). It depends on lengths and on which characters are token characters, a class
  fixed for everyone, never on a secret; the end of the stream lets the rest go as it is
  (a piece of a secret is not a secret).
- Backend text that the gateway quotes in its own words is scrubbed before it is cut to
  length (`excerpt`): cut first, a secret across the cut could no longer be found.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterable, Mapping
from typing import AnyStr, Generic

REDACTED = "[redacted]"
MIN_SECRET = 4  # shorter strings would mangle ordinary text and protect nothing
FRAGMENT = 8  # runs of a secret this long are taken out of recordings (only)
TOKEN = string.ascii_letters + string.digits + "-._~+/="  # token68: what keys are made of


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


# The least a long token run waits, whatever the keys: a window of the longest key's length
# would tell a client how long the key is (feed one long token, see when it leaves).
WINDOW_FLOOR = 255


def window(secrets: tuple[str, ...] | tuple[bytes, ...]) -> int:
    """The most of a stream held back: WINDOW_FLOOR, or the longest secret less one
    character when that is more (a key that long is caught whole all the same)."""
    return max(WINDOW_FLOOR, max(map(len, secrets)) - 1)


def token_chars(secrets: tuple[AnyStr, ...]) -> AnyStr | None:
    """`TOKEN` (as str or bytes) when every secret is made of it, else None."""
    raw = secrets[0].__class__ is bytes
    chars = TOKEN.encode() if raw else TOKEN
    if all(not s.strip(chars) for s in secrets):  # type: ignore[arg-type]
        return chars  # type: ignore[return-value]
    return None


def held_back(text: AnyStr, window: int, tokens: AnyStr | None) -> int:
    """How many characters at the end of `text` must wait: the run of token characters it
    ends in (no secret reaches past one), at most `window`; with no `tokens`, `window`."""
    tail = text[-window:]
    return len(tail) - len(tail.rstrip(tokens)) if tokens is not None else len(tail)


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
    `feed(piece)` returns what came so far less what left before and what must wait
    (`held_back`), `flush` the rest, as it is. For a stream whose pieces need not stay
    whole: the raw bytes of a recording, which no client reads, and where `fragments` also
    takes out every run of `FRAGMENT` characters of a secret (in raw bytes, a key the
    backend split across deltas is never whole).
    """

    __slots__ = ("_fragments", "_redacted", "_secrets", "_text", "_tokens", "window")

    def __init__(self, secrets: tuple[AnyStr, ...], *, fragments: bool = False) -> None:
        self._secrets: tuple[AnyStr, ...] = secrets
        self._fragments = fragments
        self.window = window(secrets)
        self._tokens: AnyStr | None = token_chars(secrets)
        self._redacted: AnyStr = _marker(secrets[0])
        self._text: AnyStr = secrets[0][:0]  # what is held back

    def feed(self, piece: AnyStr) -> AnyStr:
        text = self._text + piece
        for secret in self._secrets:
            if secret in text:
                text = _pattern(self._secrets).sub(self._redacted, text)
                break
        cut = len(text) - held_back(text, self.window, self._tokens)
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


def redact_pieces(pieces: list[str], text: str, secrets: tuple[str, ...]) -> tuple[list[str], str]:
    """`pieces` (whose join is `text`) with every whole secret in `text` taken out, and their
    new join: the marker in the piece where a secret starts, nothing of the rest of it; a
    piece no secret touches is the same object."""
    spans = [m.span() for m in _pattern(secrets).finditer(text)]
    out: list[str] = []
    start = 0
    for piece in pieces:
        end = start + len(piece)
        out.append(_cut(piece, text, start, end, spans, REDACTED))
        start = end
    return out, "".join(out)


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
