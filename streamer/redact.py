"""Secrets never leave through the backend's words: scrub them from whatever it says.

A backend may echo the key it was sent (a 401 body quoting the bad key, a proxy's error
page, a chunk). Its messages reach clients, logs, stores and recordings, so the
upstream is wrapped once: every error raised before the stream, every error delta in
it, every raw chunk handed to a recorder and the `/models` body have the configured
keys (and the client's forwarded bearer token) replaced by `[redacted]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .deltas import Delta, UpstreamError
from .errors import RequestError

REDACTED = "[redacted]"
_MIN_SECRET = 4  # shorter strings would mangle ordinary text and protect nothing


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


def scrub_error(exc: RequestError, secrets: tuple[str, ...]) -> RequestError:
    """The same error with every backend-chosen string scrubbed (in place)."""
    exc.message = scrub(exc.message, secrets)
    exc.args = (exc.message,)
    for attr in ("param", "code", "type"):
        value = getattr(exc, attr)
        if isinstance(value, str):
            setattr(exc, attr, scrub(value, secrets))
    exc.headers = {k: scrub(v, secrets) for k, v in exc.headers.items()}
    return exc


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

    async def open(
        self,
        chat_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> Any:
        secrets = self.secrets
        token = bearer_token(headers)
        if token:
            secrets = secrets_of((*secrets, token))
        if on_raw is not None and secrets:
            record = on_raw

            def on_raw(data: bytes) -> None:
                record(scrub_bytes(data, secrets))

        kwargs: dict[str, Any] = {"headers": headers, "client": client}
        if on_raw is not None:
            kwargs["on_raw"] = on_raw
        try:
            stream = await self.inner.open(chat_request, **kwargs)
        except RequestError as exc:
            raise scrub_error(exc, secrets) from None
        return _RedactingStream(stream, secrets) if secrets else stream

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        secrets = self.secrets
        token = bearer_token(headers)
        if token:
            secrets = secrets_of((*secrets, token))
        try:
            status, body = await self.inner.get_models(headers=headers)
        except RequestError as exc:
            raise scrub_error(exc, secrets) from None
        return status, scrub_bytes(body, secrets)

    async def ping(self) -> bool:
        return bool(await self.inner.ping())

    async def close(self) -> None:
        await self.inner.close()


class _RedactingStream:
    """The inner stream, with its failure deltas and errors scrubbed."""

    def __init__(self, inner: Any, secrets: tuple[str, ...]) -> None:
        self.inner = inner
        self.secrets = secrets

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __aiter__(self) -> _RedactingStream:
        return self

    async def __anext__(self) -> list[Delta]:
        try:
            batch = await self.inner.__anext__()
        except RequestError as exc:
            raise scrub_error(exc, self.secrets) from None
        # A failure is always the batch's last delta (the stream ends there): one check
        # per batch, not one per delta.
        if batch and type(batch[-1]) is UpstreamError:
            delta = batch[-1]
            delta.message = scrub(delta.message, self.secrets)
            delta.code = scrub(delta.code, self.secrets)
        return batch

    async def aclose(self) -> None:
        await self.inner.aclose()
