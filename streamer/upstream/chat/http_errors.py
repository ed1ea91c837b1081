"""A backend's non-2xx answer -> the `RequestError` the client gets (pure).

The status, type, code and param survive; the body's message is read from the shapes
backends use, scrubbed of secrets; rate-limit headers pass on only when well-formed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from streamer.core.errors import RequestError
from streamer.redact import scrub
from streamer.upstream.chat.error_shapes import CONTEXT_OVERFLOW, is_context_overflow, is_rejection

_RATE_LIMIT_HEADERS = ("retry-after", "retry-after-ms")
_ERROR_TEXT = 500  # characters of a non-JSON error body quoted in the message
# What may be passed on to a client: RFC 9110 token names and field values (visible ASCII,
# SP/HTAB only inside), short. Anything else would make aiohttp refuse the whole answer.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")
_MAX_KEPT_VALUE = 256
_MAX_KEPT_HEADERS = 16


def rate_limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`Retry-After(-Ms)` and `x-ratelimit-*`, for the client: only well-formed ones, bounded
    in length and number; an illegal one is dropped, never passed on to break the answer."""
    kept: dict[str, str] = {}
    for key, value in headers.items():
        lower = key.lower()
        if not (lower in _RATE_LIMIT_HEADERS or lower.startswith("x-ratelimit-")):
            continue
        legal = _TOKEN.fullmatch(lower) and _FIELD_VALUE.fullmatch(value)
        if legal and len(value) <= _MAX_KEPT_VALUE and len(kept) < _MAX_KEPT_HEADERS:
            kept[lower] = value
    return kept


def http_error(
    status: int, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...] = ()
) -> RequestError:
    """A backend's non-2xx answer as a `RequestError` that keeps its status and details.

    Reads OpenAI's `{"error": {...}}`, Ollama's `{"error": "text"}`, vLLM's flat
    `{"object": "error", "message": ...}` and FastAPI's `{"detail": "text"}`; any other
    body becomes the message as text, `secrets` scrubbed before it is cut (a cut secret
    could no longer be found). Well-formed rate-limit headers are kept on 429 and 503.
    """
    if status < 400:  # redirects are not followed: the upstream URL is wrong
        return RequestError(
            f"The backend answered HTTP {status} (a redirect); check the upstream URL.",
            status=502,
            type="server_error",
            code="upstream_error",
        )
    kept = rate_limit_headers(headers) if status in (429, 503) else {}
    details: dict[str, Any] = {}
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict):
            details = err
        elif isinstance(err, str):
            details = {"message": err}
        elif parsed.get("object") == "error" or "message" in parsed:
            details = parsed
        elif isinstance(parsed.get("detail"), str):
            details = {"message": parsed["detail"]}
    message = details.get("message")
    if not (isinstance(message, str) and message):
        text = scrub(raw.decode("utf-8", "replace").strip(), secrets)[:_ERROR_TEXT]
        message = f"The backend answered HTTP {status}" + (f": {text}" if text else ".")
    type_ = _text(details.get("type")) or None
    code = _text(details.get("code")) or None
    param = details.get("param")
    if is_context_overflow(type_, message) or is_context_overflow(code, message):
        code = CONTEXT_OVERFLOW
        status, type_ = (400, "invalid_request_error") if status >= 500 else (status, type_)
    elif status >= 500 and is_rejection(message):  # sent again it fails again: a 4xx
        status, type_ = 400, "invalid_request_error"
    return RequestError(
        message,
        status=status,
        type=type_ or ("server_error" if status >= 500 else "invalid_request_error"),
        code=code,
        param=param if isinstance(param, str) and param else None,
        headers=kept,
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
