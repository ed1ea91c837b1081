"""aiohttp's side of the endpoint (`endpoint.py`): its middlewares, its response hook and
its `Expect` handler, each a thin call of the endpoint's one rule.

- `observe_middleware`: `Observed` (request id, metrics with closed labels, access line);
- `errors_middleware`: `error_answer`, plus aiohttp's own routing errors in OpenAI's words;
- `auth_middleware`: `Endpoint.authenticate` before the handler (which reads the body);
- `decorate`: the endpoint's `Decorations` on every answer (streamed, upgraded or not);
- `expect_rules`: `Expect: 100-continue` invites the body only once the key passed, and an
  `Expect` it cannot meet is a 417 in OpenAI's shape, whatever its bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http import HttpVersion11

from streamer.core.errors import RequestError
from streamer.frontends.api_keys import CLIENT
from streamer.frontends.endpoint import Observed, closes, error_answer
from streamer.frontends.http import DECORATIONS, ENDPOINT, GATEWAY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID = web.RequestKey("request_id", str)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _error(exc: RequestError) -> web.Response:
    response = web.Response(
        body=orjson.dumps(exc.body()),
        status=exc.status,
        content_type="application/json",
        headers=exc.headers,
    )
    if closes(exc):  # said from the head, or mid-body: aiohttp drains the rest, then closes
        response.force_close()
    return response


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (echoed as `X-Request-Id`), request metrics and an access log line."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    metrics = request.app[GATEWAY].metrics
    offered = request.headers.get("X-Request-Id")
    with Observed(metrics, request.method, route, request.path, offered, request.headers) as seen:
        request[REQUEST_ID] = seen.rid  # `decorate` puts it on the answer, streamed or not
        # a WebSocket's handler lasts as long as its socket
        socket = request.headers.get("Upgrade", "").lower() == "websocket"
        if socket:
            metrics.active_sockets.inc()
        try:
            response = await handler(request)
        finally:
            if socket:
                metrics.active_sockets.dec()
        seen.status = response.status
        return response


def _http_error(request: web.Request, exc: web.HTTPException) -> RequestError:
    """aiohttp's routing errors (404, 405, …) in OpenAI's words."""
    where = f"{request.method} {request.path}"
    if exc.status == 404:
        return RequestError(f"Invalid URL ({where}).", status=404, code="not_found")
    if exc.status == 405:
        allow = exc.headers.get("Allow", "")
        return RequestError(
            f"Method not allowed ({where}); this path accepts {allow or 'other methods'}.",
            status=405,
            code="method_not_allowed",
            headers={"Allow": allow} if allow else None,
        )
    return RequestError(exc.reason, status=exc.status)


async def decorate(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every answer (SSE, background streams, upgrades) carries the
    endpoint's decorations: its request id, the worker's index."""
    for name, value in request.app[DECORATIONS].fields(request.get(REQUEST_ID)):
        response.headers[name] = value


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as OpenAI's error shape (`endpoint.error_answer`); never a
    traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(_http_error(request, exc))
    except ConnectionResetError:
        raise
    except Exception as exc:
        return _error(error_answer(exc, f"{request.method} {request.path}"))


def auth_middleware(*, metrics: bool = False) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The endpoint's key check (`Endpoint.authenticate`) on the `guarded` paths, from the
    head alone: the handler, which reads the body, runs after it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if guarded(request.path, metrics):
            request[CLIENT] = ""
            who = request.app[ENDPOINT].authenticate(request.headers.get("Authorization"))
            request[CLIENT] = who or ""
        return await handler(request)

    return middleware


def guarded(path: str, metrics: bool) -> bool:
    """The paths that need a client key: /v1 routes (and /metrics with --metrics-auth)."""
    return path.startswith("/v1/") or (metrics and path == "/metrics")


def expect_rules(router: web.UrlDispatcher, *, metrics: bool) -> None:
    """Every route of `router` (once they are all added) takes `Expect` by `_expect`.
    aiohttp has a public `expect_handler` only per `add_route` call; its `add_get` does not
    pass it on, hence the attribute (tests/hostile/test_hostile_request_door.py fails if
    aiohttp renames it)."""
    handler = _expect(metrics)
    for route in router.routes():
        route._expect_handler = handler


def _expect(
    metrics: bool,
) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse | None]]:
    async def expect(request: web.Request) -> web.StreamResponse | None:
        """aiohttp's default handler, but the body is invited only for a key that passes
        (else the 401 comes from the head, the body never sent), and any other `Expect` is a
        417 that can be written whatever bytes it held (aiohttp's own failed on them)."""
        value = request.headers.get("Expect", "")
        if request.version != HttpVersion11:
            return None
        if value.lower() != "100-continue":
            shown = value.encode("ascii", "replace")[:40].decode()
            error = RequestError(
                f"Unsupported Expect {shown!r}: only 100-continue is.",
                status=417,
                code="expectation_failed",
            )
            return _error(error)
        if guarded(request.path, metrics):
            try:
                request.app[ENDPOINT].authenticate(request.headers.get("Authorization"))
            except RequestError:
                return None  # the auth middleware answers it, from the head
        await request.writer.write(CONTINUE)
        request.writer.output_size = 0  # the answer itself has not begun
        return None

    return expect
