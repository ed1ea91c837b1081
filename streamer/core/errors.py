"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`.

Raised anywhere in the core with a `param` path that points at the offending field;
the HTTP and WebSocket shells only choose how to encode them.
"""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A client error (4xx) or a gateway/backend error (5xx) in OpenAI's error shape."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type = type
        self.headers = headers or {}

    def details(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def body(self) -> dict[str, Any]:
        """The HTTP body: `{"error": {...}}`."""
        return {"error": self.details()}

    def ws_event(self) -> dict[str, Any]:
        """The WebSocket error event: details nested, HTTP status beside them. The spec's
        WebSocket error always has a `code`: an error without its own has its type's."""
        details = self.details()
        if details["code"] is None:
            details["code"] = self.type
        return {"type": "error", "status": self.status, "error": details}

    def __repr__(self) -> str:
        return f"RequestError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


# `error.code`s a client can act on: the spec's (`ResponseError.code`), plus the ones
# Codex classifies itself (context window, quota, plan).
FAILURE_CODES = frozenset(
    {
        "server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout",
        "invalid_image", "invalid_image_format", "invalid_base64_image", "invalid_image_url",
        "image_too_large", "image_too_small", "image_parse_error",
        "image_content_policy_violation", "invalid_image_mode", "image_file_too_large",
        "unsupported_image_media_type", "empty_image_file", "failed_to_download_image",
        "image_file_not_found", "context_length_exceeded", "insufficient_quota",
        "usage_not_included",
    }
)  # fmt: skip
# The `type` OpenAI gives each of those codes in its error bodies; any other is a request's.
_CODE_TYPES = {
    "server_error": "server_error",
    "vector_store_timeout": "server_error",
    "rate_limit_exceeded": "requests",
    "insufficient_quota": "insufficient_quota",
}


def failure(code: str, message: str, type: str | None = None) -> dict[str, Any]:
    """A failed Response's `error`: `{code, message, type}`.

    `code` stays when clients know it (FAILURE_CODES), with the backend's own `type` if it
    gave one, else the code's; any other code becomes `server_error`, the original kept as
    the `type` (what operators count failures by; a generic backend type would hide it).
    `type` is always there: the Vercel AI SDK rejects a Response whose error has none."""
    if code not in FAILURE_CODES:
        return {"code": "server_error", "message": message, "type": code}
    return {
        "code": code,
        "message": message,
        "type": type or _CODE_TYPES.get(code, "invalid_request_error"),
    }


def invalid(message: str, param: str | None = None, code: str | None = None) -> RequestError:
    """A 400 `invalid_request_error`."""
    return RequestError(message, param=param, code=code)


def server_error(message: str, status: int = 500, code: str = "server_error") -> RequestError:
    return RequestError(message, status=status, type="server_error", code=code)


def shutting_down(advice: str = "retry the request") -> RequestError:
    """The gateway is draining for a shutdown: a 503 that tells the client what to do."""
    return RequestError(
        f"The server is shutting down; {advice}.",
        status=503,
        type="server_error",
        code="server_shutting_down",
    )


STORE_UNAVAILABLE = "store_unavailable"
"""The code of every store outage a client sees: a 503 before the turn, a background
turn's `failed` response, a follower's `error` event."""


def store_unavailable(reason: object) -> RequestError:
    """A store outage as the client sees it (`reason`: the store's `StoreUnavailable`): a
    503, never a hang."""
    return RequestError(
        f"The response store is unavailable: {reason}",
        status=503,
        type="server_error",
        code=STORE_UNAVAILABLE,
    )
