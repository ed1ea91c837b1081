"""A Messages backend's errors in OpenAI's shape (pure).

Anthropic answers `{"type": "error", "error": {"type", "message"}, "request_id"}` with the
status of its type, and sends the same object as an `error` event mid-stream. What clients
act on: `overloaded_error` (HTTP 529, a status no OpenAI client knows) is a 503 with
`retry-after` (the backend's, else a second); `rate_limit_error` a 429 keeping the
backend's `retry-after` and rate-limit headers; `invalid_request_error` a 400 with the
backend's message, `context_length_exceeded` when it says the prompt is too long (what
`truncation: "auto"` and Codex's compaction act on); the rest as the shared reading of a
non-2xx answer does (streamer/upstream/chat/http_errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from streamer.core.deltas import UpstreamError
from streamer.core.errors import RequestError
from streamer.core.scrub import scrub
from streamer.upstream.chat.error_shapes import CONTEXT_OVERFLOW, is_context_overflow
from streamer.upstream.chat.http_errors import http_error as shared_http_error
from streamer.upstream.chat.http_errors import rate_limit_headers

OVERLOADED = 529
DEFAULT_RETRY_AFTER = "1"
# Anthropic's wording for a prompt over the context window ("prompt is too long: 208310
# tokens > 200000 maximum"), and its stop-short cousin.
_OVERFLOW_PHRASES = ("prompt is too long", "input is too long", "context window")
# An error event's type -> the code of the failed response where the spec has one; any other
# type is the code as it is (the response then says `server_error`, the type kept beside it).
_STREAM_CODES = {"rate_limit_error": "rate_limit_exceeded"}


def overflow(kind: str | None, message: str) -> bool:
    lower = message.lower()
    return is_context_overflow(kind, message) or any(p in lower for p in _OVERFLOW_PHRASES)


def http_error(
    status: int, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...] = ()
) -> RequestError:
    """A Messages backend's non-2xx answer as the `RequestError` the client gets."""
    error = shared_http_error(status, raw, headers, secrets)
    kind = error.type
    if status == OVERLOADED or kind == "overloaded_error":
        kept = rate_limit_headers({**headers, "retry-after": _retry_after(headers)})
        return RequestError(
            f"The backend is overloaded; retry in a few seconds. ({error.message})",
            status=503,
            type="server_error",
            code="server_is_overloaded",
            headers=kept,
        )
    if kind == "rate_limit_error":
        error.status, error.code = 429, error.code or "rate_limit_exceeded"
        error.headers = rate_limit_headers(headers)
    elif error.code != CONTEXT_OVERFLOW and overflow(kind, error.message):
        error.status, error.code = 400, CONTEXT_OVERFLOW
        error.type = "invalid_request_error"
    return error


def _retry_after(headers: Mapping[str, str]) -> str:
    for key, value in headers.items():
        if key.lower() == "retry-after" and value.strip():
            return value
    return DEFAULT_RETRY_AFTER


def stream_error(obj: Mapping[str, Any], secrets: tuple[str, ...] = ()) -> UpstreamError:
    """An `error` event (or an error body on a 2xx) -> the turn's failure, its words
    scrubbed of `secrets` (whole ones) where they enter."""
    inner = obj.get("error")
    err: Mapping[str, Any] = inner if isinstance(inner, Mapping) else obj
    raw_kind = err.get("type")
    kind = raw_kind if isinstance(raw_kind, str) else ""
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = "The backend reported an error."
    if secrets:
        message, kind = scrub(message, secrets), scrub(kind, secrets)
    if overflow(kind, message):
        return UpstreamError(CONTEXT_OVERFLOW, message)
    return UpstreamError(_STREAM_CODES.get(kind, kind or "server_error"), message)


def error_body(raw: bytes | bytearray) -> Mapping[str, Any] | None:
    """The error object of a 2xx body that is Anthropic's error shape, else None."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(body, dict) and body.get("type") == "error":
        return body
    return None
