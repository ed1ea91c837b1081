"""Secrets never leave through the backend's words: scrub them from whatever it says.

A backend may echo the key it was sent (a 401 body quoting the bad key, a proxy's error
page, a chunk, the answer's own text). Its words reach clients, logs, stores and
recordings, so the upstream is wrapped once: every error raised before the stream, every
error delta in it, every output delta (text, reasoning, refusal, tool arguments), every raw
chunk handed to a recorder and the `/models` body have the configured keys (and the
client's forwarded bearer token) replaced by `[redacted]`.

Three rules make that hold whatever the backend does:
- A stream is scrubbed as one text, not piece by piece: `StreamScrubber` holds back only a
  tail that could be the start of a secret, so a key split across deltas or reads is still
  one key. With no secret configured nothing is wrapped; with one, an ordinary piece costs
  one regex search (C) and is passed on as it is.
- Error text may have been cut by whoever built it (an excerpt of a body, a header line):
  `scrub_message` also removes every run of `FRAGMENT` or more characters of a secret, so a
  cut key leaves nothing worth having.
- Recordings get both: whole keys across reads, and fragments within each read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from types import NoneType
from typing import Any, AnyStr, Generic

from streamer.core.deltas import (
    Delta,
    LoggedText,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    TextRun,
    ToolCallDelta,
    ToolCallRun,
    UpstreamError,
    expand,
)
from streamer.core.errors import RequestError
from streamer.upstream.batch import Batch

REDACTED = "[redacted]"
_MIN_SECRET = 4  # shorter strings would mangle ordinary text and protect nothing
FRAGMENT = 8  # runs of a secret this long are scrubbed from error text and recordings


def secrets_of(values: Iterable[str | None]) -> tuple[str, ...]:
    """The distinct secrets worth scrubbing, longest first (a key may contain another)."""
    found = {v for v in values if v and len(v) >= _MIN_SECRET}
    return tuple(sorted(found, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
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


def _fragment_spans(text: AnyStr, secrets: tuple[AnyStr, ...]) -> list[tuple[int, int]]:
    """Merged [start, end) spans of `text` covered by a FRAGMENT-long run of a secret."""
    covered: list[tuple[int, int]] = []
    for secret in secrets:
        for i in range(len(secret) - FRAGMENT + 1):
            window = secret[i : i + FRAGMENT]
            at = text.find(window)
            while at >= 0:
                covered.append((at, at + FRAGMENT))
                at = text.find(window, at + 1)
    covered.sort()
    merged: list[tuple[int, int]] = []
    for start, end in covered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def scrub_fragments(text: AnyStr, secrets: tuple[AnyStr, ...], redacted: AnyStr) -> AnyStr:
    """`text` with every run of FRAGMENT or more characters of a secret replaced."""
    spans = _fragment_spans(text, secrets)
    if not spans:
        return text
    parts: list[AnyStr] = []
    last = 0
    for start, end in spans:
        parts += (text[last:start], redacted)
        last = end
    parts.append(text[last:])
    return redacted[:0].join(parts)


def scrub_message(text: str, secrets: tuple[str, ...]) -> str:
    """Error text: whole secrets, then any cut-off run of one (someone may have truncated it)."""
    return scrub_fragments(scrub(text, secrets), secrets, REDACTED)


def scrub_error(exc: RequestError, secrets: tuple[str, ...]) -> RequestError:
    """The same error with every backend-chosen string scrubbed (in place)."""
    exc.message = scrub_message(exc.message, secrets)
    exc.args = (exc.message,)
    for attr in ("param", "code", "type"):
        value = getattr(exc, attr)
        if isinstance(value, str):
            setattr(exc, attr, scrub_message(value, secrets))
    exc.headers = {k: scrub_message(v, secrets) for k, v in exc.headers.items()}
    return exc


@functools.lru_cache(maxsize=64)  # one per set of secrets, not one per request
def _prefixes_by_last(secrets: tuple[AnyStr, ...]) -> dict[AnyStr, tuple[AnyStr, ...]]:
    """Every proper prefix of a secret (what a held tail may be), longest first, by its last
    character: a piece can only end in one if its own last character has an entry here."""
    ends: dict[AnyStr, list[AnyStr]] = {}
    for secret in secrets:
        for i in range(1, len(secret)):
            ends.setdefault(secret[i - 1 : i], []).append(secret[:i])
    return {last: tuple(sorted(p, key=len, reverse=True)) for last, p in ends.items()}


class StreamScrubber(Generic[AnyStr]):
    """One stream of text (or bytes) scrubbed as a whole, piece by piece.

    `feed` returns what can be passed on now; only a tail that could be the start of a
    secret is held back, and `flush` returns it at the end (a start of FRAGMENT or more
    characters is redacted: the stream stopped inside a secret). `fragments`: also scrub
    FRAGMENT-long runs of a secret within each piece (recordings).
    """

    __slots__ = ("_ends", "_fragments", "_redacted", "_secrets", "_shortest", "held")

    def __init__(self, secrets: tuple[AnyStr, ...], *, fragments: bool = False) -> None:
        self._secrets: tuple[AnyStr, ...] = secrets
        self._shortest = min(map(len, secrets))
        self._ends = _prefixes_by_last(secrets)
        self._fragments = fragments
        self._redacted: AnyStr = REDACTED.encode() if isinstance(secrets[0], bytes) else REDACTED
        self.held: AnyStr = secrets[0][:0]

    def passes(self, piece: AnyStr) -> bool:
        """Whether `feed` would pass `piece` on unchanged, holding nothing: the common case,
        a token shorter than any secret that does not end like the start of one (one
        dictionary lookup and, if its last character is in a secret, one C-level check)."""
        if self.held or len(piece) >= self._shortest or self._fragments:
            return False
        ends = self._ends.get(piece[-1:])
        return ends is None or not piece.endswith(ends)

    def feed(self, piece: AnyStr) -> AnyStr:
        if self.passes(piece):
            return piece
        if self.held:
            piece, self.held = self.held + piece, self.held[:0]
        for secret in self._secrets:
            if secret in piece:
                piece = piece.replace(secret, self._redacted)
        at = self._tail(piece)
        if at >= 0:
            piece, self.held = piece[:at], piece[at:]
        if self._fragments:
            piece = scrub_fragments(piece, self._secrets, self._redacted)
        return piece

    def _tail(self, piece: AnyStr) -> int:
        """Where the longest tail of `piece` that is a proper prefix of a secret starts, or -1."""
        for prefix in self._ends.get(piece[-1:], ()):  # longest first
            if piece.endswith(prefix):
                return len(piece) - len(prefix)
        return -1

    def flush(self) -> AnyStr:
        held, self.held = self.held, self.held[:0]
        return self._redacted if len(held) >= FRAGMENT else held


def bearer_token(headers: dict[str, str] | None) -> str | None:
    """The token of a forwarded `Authorization: Bearer …` header, if any."""
    for key, value in (headers or {}).items():
        if key.lower() == "authorization":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else value
    return None


class RedactingUpstream:
    """An upstream whose every word back is free of `secrets` (and of forwarded tokens)."""

    def __init__(self, inner: Any, secrets: Iterable[str | None]) -> None:
        self.inner = inner
        self.secrets = secrets_of(secrets)

    def __getattr__(self, name: str) -> Any:  # everything else is the inner upstream's
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RedactingUpstream({self.inner!r})"

    def _secrets_for(self, headers: dict[str, str] | None) -> tuple[str, ...]:
        token = bearer_token(headers)
        return secrets_of((*self.secrets, token)) if token else self.secrets

    async def open(
        self,
        backend_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        **options: Any,
    ) -> Any:
        """The inner `open`; `options` (e.g. `client=`) pass through untouched."""
        secrets = self._secrets_for(headers)
        recording: _RecordingScrubber | None = None
        if on_raw is not None and secrets:
            recording = _RecordingScrubber(on_raw, secrets)
            on_raw = recording.feed
        kwargs: dict[str, Any] = {"headers": headers, **options}
        if on_raw is not None:
            kwargs["on_raw"] = on_raw
        try:
            stream = await self.inner.open(backend_request, **kwargs)
        except RequestError as exc:
            if recording is not None:
                recording.flush()
            raise scrub_error(exc, secrets) from None
        except BaseException:
            if recording is not None:
                recording.flush()
            raise
        return _RedactingStream(stream, secrets, recording) if secrets else stream

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        secrets = self._secrets_for(headers)
        try:
            status, body = await self.inner.get_models(headers=headers)
        except RequestError as exc:
            raise scrub_error(exc, secrets) from None
        if secrets:
            raw = tuple(secret.encode() for secret in secrets)
            body = scrub_fragments(scrub_bytes(body, secrets), raw, REDACTED.encode())
        return status, body

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def close(self) -> None:
        await self.inner.close()


class _RecordingScrubber:
    """The raw bytes on their way to a recorder, scrubbed across reads (see StreamScrubber)."""

    __slots__ = ("_record", "_scrubber")

    def __init__(self, record: Callable[[bytes], None], secrets: tuple[str, ...]) -> None:
        self._record = record
        raw = tuple(secret.encode() for secret in secrets)
        self._scrubber: StreamScrubber[bytes] = StreamScrubber(raw, fragments=True)

    def feed(self, data: bytes) -> None:
        data = self._scrubber.feed(data)
        if data:
            self._record(data)

    def flush(self) -> None:
        """The held tail, once the stream is over (the recording stays whole)."""
        rest = self._scrubber.flush()
        if rest:
            self._record(rest)


_TEXTS = (TextDelta, LoggedText, ReasoningDelta, RefusalDelta)
_PLAIN: dict[type, type] = {TextRun: TextDelta, ToolCallRun: ToolCallDelta}  # a run's pieces


class _RedactingStream:
    """The inner stream with every backend-chosen string scrubbed, output text included.

    The output is scrubbed as one text per channel (text, reasoning, refusal, one tool
    call's arguments): a delta of another channel, a finish or the end of the stream
    first flushes the tail held back from the previous one.
    """

    def __init__(
        self, inner: Any, secrets: tuple[str, ...], recording: _RecordingScrubber | None = None
    ) -> None:
        self.inner = inner
        self.secrets = secrets
        self._recording = recording
        self._scrubber: StreamScrubber[str] = StreamScrubber(secrets)
        self._channel: Delta | None = None  # the last output delta: its kind and tool index
        self._ended = False
        first = inner.first
        self.first = None if first is None else self._scrubbed(first)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __aiter__(self) -> _RedactingStream:
        return self

    async def __anext__(self) -> Batch:
        if self._ended:
            raise StopAsyncIteration
        try:
            batch = await self.inner.__anext__()
        except RequestError as exc:
            raise scrub_error(exc, self.secrets) from None
        except StopAsyncIteration:
            self._ended = True
            rest = self._flush()
            if rest:
                return Batch(rest, end=True)
            raise
        return self._scrubbed(batch)

    def _scrubbed(self, batch: Batch) -> Batch:
        """The batch scrubbed; the last one also carries the tail held back (nothing follows)."""
        out = self._scrub_batch(batch)
        if batch.end:
            self._ended = True
            out = out + self._flush()
        elif out is batch:
            return batch
        return Batch(out, end=batch.end)

    def _scrub_batch(self, batch: list[Delta]) -> list[Delta]:
        """The batch as it is while every delta continues the current channel and passes
        (`StreamScrubber.passes`, inlined: this runs once per delta); from the first that
        does not, the rest goes through `_scrub_from`."""
        scrubber = self._scrubber
        channel = self._channel
        kind = channel.__class__
        if scrubber.held or kind is NoneType:
            return self._scrub_runs_from(batch, 0)
        ends, shortest = scrubber._ends, scrubber._shortest
        tool = kind is ToolCallDelta
        index = channel.index if tool else 0  # type: ignore[union-attr]
        i = -1  # a counter is cheaper than enumerate here
        for delta in batch:
            i += 1
            cls = delta.__class__
            if cls is TextRun or cls is ToolCallRun:  # a run passes if each piece does
                cls, pieces = _PLAIN[cls], delta.pieces  # type: ignore[union-attr]
            else:
                pieces = None
            if cls is not kind:
                return self._scrub_runs_from(batch, i)
            if tool:
                if delta.index != index:  # type: ignore[union-attr]
                    return self._scrub_runs_from(batch, i)
                piece = delta.arguments  # type: ignore[union-attr]
            else:
                piece = delta.text  # type: ignore[union-attr]
            for one in pieces or (piece,):
                if not one or len(one) >= shortest:
                    return self._scrub_runs_from(batch, i)
                tails = ends.get(one[-1])  # an index, not a slice: no new string
                if tails is not None and one.endswith(tails):
                    return self._scrub_runs_from(batch, i)
        return batch

    def _scrub_runs_from(self, batch: list[Delta], start: int) -> list[Delta]:
        """`_scrub_from`, the runs from `start` on taken piece by piece (a secret may span
        pieces; the scrubber holds and cuts within one)."""
        return self._scrub_from(batch[:start] + expand(batch[start:]), start)

    def _scrub_from(self, batch: list[Delta], start: int) -> list[Delta]:
        out = batch[:start]
        append = out.append
        feed = self._scrubber.feed
        for delta in batch[start:]:
            cls = delta.__class__
            channel = self._channel
            if cls is ToolCallDelta:
                if channel.__class__ is not cls or channel.index != delta.index:  # type: ignore[union-attr]
                    out += self._flush()
                    self._channel = delta
                delta.arguments = feed(delta.arguments)  # type: ignore[union-attr]
                if delta.arguments or delta.id or delta.name:  # type: ignore[union-attr]
                    append(delta)
            elif cls in _TEXTS:
                if channel.__class__ is not cls:
                    out += self._flush()
                    self._channel = delta
                text = delta.text  # type: ignore[union-attr]
                delta.text = feed(text)  # type: ignore[union-attr]
                if cls is LoggedText and delta.text != text:  # type: ignore[union-attr]
                    delta.logprobs = []  # type: ignore[union-attr]  # its tokens spell the text
                if delta.text:  # type: ignore[union-attr]
                    append(delta)
            else:  # finish, usage, failure: the output before it is over
                out += self._flush()
                if cls is UpstreamError:
                    delta.message = scrub_message(delta.message, self.secrets)  # type: ignore[union-attr]
                    delta.code = scrub_message(delta.code, self.secrets)  # type: ignore[union-attr]
                append(delta)
        return out

    def _flush(self) -> list[Delta]:
        """The held tail of the current channel, as one more delta of it."""
        channel, self._channel = self._channel, None
        rest = self._scrubber.flush()
        if not rest or channel is None:
            return []
        if isinstance(channel, ToolCallDelta):
            return [ToolCallDelta(channel.index, None, None, rest)]
        if isinstance(channel, TextDelta | ReasoningDelta | RefusalDelta):
            return [channel.__class__(rest)]  # a LoggedText's tail: no logprobs of its own
        return []  # only output channels are ever current

    async def aclose(self) -> None:
        if self._recording is not None:
            self._recording.flush()
            self._recording = None
        await self.inner.aclose()
