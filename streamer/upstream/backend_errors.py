"""A backend's failures in the turn's terms: what the shared client raises (pure).

Transport failures (unreachable, timed out, closed early, invalid HTTP, an undecodable
content coding, a whole-JSON answer past its limits) are 5xx `RequestError`s that name the
backend by host and port only (a base URL may carry credentials). A non-2xx answer keeps
the backend's status and details, read by the kind's `Wire.http_error`; a 400 naming
optional parameters of the request is `Rejected`, which the client sends again without them.
"""

from __future__ import annotations

from typing import Any

from streamer.core.errors import RequestError, server_error
from streamer.upstream.http1.connection import Response
from streamer.upstream.http1.content_coding import ContentCodingError, DecodedResponse
from streamer.upstream.http1.wire import HTTPClientError, ProtocolError
from streamer.upstream.kind import HttpError, RejectedParams

ERROR_BODY_LIMIT = 1 << 20  # enough for any error message; a larger body is cut
TOO_LARGE = "upstream_response_too_large"


class Rejected(RequestError):
    """A backend's 400 that names optional parameters of the request (`names`) it does
    not take: `BackendClient.open` sends the request again without them."""

    def __init__(self, error: RequestError, names: tuple[str, ...]) -> None:
        super().__init__(
            error.message,
            param=error.param,
            code=error.code,
            status=error.status,
            type=error.type,
            headers=error.headers,
        )
        self.error = error
        self.names = names


class Failures:
    """The errors of one backend (`where`: its host and port)."""

    __slots__ = ("first_byte_timeout", "where")

    def __init__(self, where: str, first_byte_timeout: float) -> None:
        self.where = where
        self.first_byte_timeout = first_byte_timeout

    def invalid(self, exc: ProtocolError, secrets: tuple[str, ...]) -> RequestError:
        """`exc` quoting the backend's bytes, whole `secrets` out before they are cut."""
        return RequestError(
            f"The backend at {self.where} sent an invalid HTTP answer: {exc.shown(secrets)}.",
            status=502,
            type="server_error",
            code="upstream_error",
        )

    def undecodable(self, exc: ContentCodingError, secrets: tuple[str, ...]) -> RequestError:
        shown = exc.shown(secrets)
        message = f"The backend at {self.where} sent an answer that cannot be decoded: {shown}."
        return server_error(message, 502, "upstream_error")

    def timed_out(self) -> RequestError:
        message = f"The backend did not answer within {self.first_byte_timeout:g} s."
        return server_error(message, 504, "upstream_timeout")

    def closed_early(self, doing: str) -> RequestError:
        message = f"The backend at {self.where} closed the connection before {doing}."
        return server_error(message, 502, "upstream_error")

    def unreachable(self, reason: str) -> RequestError:
        message = f"Could not connect to the backend at {self.where}: {reason}."
        return server_error(message, 502, "upstream_unreachable")

    def too_large(self, cap: int) -> RequestError:
        message = (
            f"The backend at {self.where} sent a JSON answer larger than the gateway "
            f"accepts ({cap} bytes)."
        )
        return server_error(message, 502, TOO_LARGE)

    @staticmethod
    def over_budget(limit: int) -> RequestError:
        message = (
            "The gateway is holding as many whole-JSON backend answers as it may "
            f"({limit} bytes, --max-backend-json-bytes); try again shortly."
        )
        return server_error(message, 503, TOO_LARGE)

    def proxy_refused(self, proxy: str) -> RequestError:
        message = (
            f"The proxy at {proxy} refused the request to the backend at {self.where}: "
            "407 Proxy Authentication Required."
        )
        return server_error(message, 502, "upstream_unreachable")


async def read_http_error(
    resp: Response | DecodedResponse,
    http_error: HttpError,
    rejected_params: RejectedParams,
    secrets: tuple[str, ...] = (),
    sent: dict[str, Any] | None = None,
) -> RequestError:
    """A backend's non-2xx answer, with its status, message, type, code and param kept
    (its words scrubbed of `secrets` where they enter: the kind's `http_error`);
    `Rejected` if it names optional parameters of `sent`."""
    if resp.status < 400:
        return http_error(resp.status, b"", resp.headers, ())
    try:
        raw = await resp.read_all(ERROR_BODY_LIMIT)
    except (TimeoutError, HTTPClientError, OSError):
        raw = b""
    exc = http_error(resp.status, raw, resp.headers, secrets)
    if exc.status == 429 and exc.code is None:  # clients key on it, as on OpenAI's own 429s
        exc.code = "rate_limit_exceeded"
    names = rejected_params(resp.status, raw, sent) if sent is not None else ()
    return Rejected(exc, names) if names else exc
