"""A backend's non-2xx answer -> the `RequestError` the client gets (pure).

The status, type, code and param survive; the body's message is read from the shapes
backends use; rate-limit headers pass on only when well-formed. Every string the backend
chose is scrubbed of whole secrets here, where it enters (streamer/core/scrub.py); the
gateway's own words are never touched. A 401 or 403 is worded by the gateway: a backend
that quotes the key it refused (OpenAI shows its first and last characters) says nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from streamer.core.errors import RequestError
from streamer.core.scrub import excerpt, scrub
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
    kept = {k: scrub(v, secrets) for k, v in kept.items()}
    details = _details(raw)
    message = details.get("message")
    if status in (401, 403):
        message = _REFUSED.format(status=status)
    elif isinstance(message, str) and message:
        message = scrub(message, secrets)
    else:
        text = excerpt(raw.decode("utf-8", "replace").strip(), _ERROR_TEXT, secrets)
        message = f"The backend answered HTTP {status}" + (f": {text}" if text else ".")
    type_ = scrub(_text(details.get("type")), secrets) or None
    code = scrub(_text(details.get("code")), secrets) or None
    param = scrub(_text(details.get("param")), secrets) or None
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
        param=param,
        headers=kept,
    )


_REFUSED = (
    "The backend refused the credentials it was sent (HTTP {status}): check "
    "--upstream-api-key (with --forward-authorization, the client's own key)."
)


def _details(raw: bytes) -> dict[str, Any]:
    """The error object of a JSON body in any of the shapes backends use ({} for none)."""
    if not raw:
        return {}
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    err = parsed.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(err, str):
        return {"message": err}
    if parsed.get("object") == "error" or "message" in parsed:
        return parsed
    if isinstance(parsed.get("detail"), str):
        return {"message": parsed["detail"]}
    return {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
