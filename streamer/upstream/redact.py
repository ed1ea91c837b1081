"""An upstream whose words back are free of secrets: what passes through as it came.

A backend may echo a key it was sent, and a client may make the model say what it likes.
The backend's words reach clients, logs, stores and recordings, so every one is scrubbed
of the configured keys (and the client's forwarded bearer token), whole keys only and
never by a partial match (streamer/core/scrub.py says why), at the place it enters:

- what the gateway wraps in its own words (error bodies, error events, bytes it quotes)
  is scrubbed by the upstream client as it reads it (`secrets`, streamer/upstream/chat/);
- what passes through as the backend sent it is scrubbed here: the output deltas (text,
  reasoning, refusal, tool arguments, per channel: streamer/core/delta_scrub.py), the raw
  bytes handed to a recorder (across reads; there, which no client reads, also every run of
  8 characters of a key, since a key split across deltas is never whole in raw bytes) and
  the `/models` body.

With no secret configured nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from streamer.core.batch import Batch
from streamer.core.delta_scrub import DeltaScrubber
from streamer.core.scrub import StreamScrubber, bearer_token, scrub_bytes, secrets_of


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
        except BaseException:  # its error was scrubbed where the backend's words entered
            if recording is not None:
                recording.flush()
            raise
        return _RedactingStream(stream, secrets, recording) if secrets else stream

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        secrets = self._secrets_for(headers)
        status, body = await self.inner.get_models(headers=headers)
        return status, scrub_bytes(body, secrets) if secrets else body

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def close(self) -> None:
        await self.inner.close()


class _RecordingScrubber:
    """The raw bytes on their way to a recorder, scrubbed across reads (`StreamScrubber`:
    the last `window` bytes wait for the next read, or the end), runs of a key included."""

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
        """The bytes held back, once the stream is over (the recording stays whole)."""
        rest = self._scrubber.flush()
        if rest:
            self._record(rest)


class _RedactingStream:
    """The inner stream with its output deltas scrubbed (`DeltaScrubber`); the end of the
    stream lets the deltas held back go, in the last batch."""

    def __init__(
        self, inner: Any, secrets: tuple[str, ...], recording: _RecordingScrubber | None = None
    ) -> None:
        self.inner = inner
        self.secrets = secrets
        self._recording = recording
        self._scrubber = DeltaScrubber(secrets)
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
        except StopAsyncIteration:
            self._ended = True
            rest = self._scrubber.flush()
            if rest:
                return Batch(rest, end=True)
            raise
        return self._scrubbed(batch)

    def _scrubbed(self, batch: Batch) -> Batch:
        """The batch scrubbed; the last one also carries what was held back (nothing follows)."""
        out = self._scrubber.feed(batch)
        if batch.end:
            self._ended = True
            out += self._scrubber.flush()
        return Batch(out, end=batch.end)

    async def aclose(self) -> None:
        if self._recording is not None:
            self._recording.flush()
            self._recording = None
        await self.inner.aclose()
