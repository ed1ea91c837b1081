"""The aiohttp application: routes, middlewares, startup and shutdown."""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from . import logs
from .config import Settings
from .errors import RequestError
from .gateway import GATEWAY, Gateway
from .identity import CLIENT, client_identity
from .logs import choose_request_id
from .response import new_id

log = logging.getLogger("streamer.app")

SETTINGS = web.AppKey("settings", Settings)

SCRIPTED_RUNNER = web.AppKey("scripted_runner", web.AppRunner)
REQUEST_ID = web.RequestKey("request_id", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(exc: RequestError) -> web.Response:
    return web.Response(
        body=orjson.dumps(exc.body()),
        status=exc.status,
        content_type="application/json",
        headers=exc.headers,
    )


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (echoed as `X-Request-Id`), request metrics and an access log line."""
    started = time.monotonic()
    rid = choose_request_id(request.headers.get("X-Request-Id"), new_id("req"))
    request[REQUEST_ID] = rid  # `_add_request_id` puts it on the answer, streamed or not
    token = logs.request_id.set(rid)
    metrics = request.app[GATEWAY].metrics
    # a WebSocket's handler lasts as long as its socket
    socket = request.headers.get("Upgrade", "").lower() == "websocket"
    if socket:
        metrics.active_sockets.inc()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = 499  # the client went away first
        raise
    finally:
        if socket:
            metrics.active_sockets.dec()
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        metrics.child(metrics.requests, request.method, name, str(status)).inc()
        logs.access(request.method, request.path, status, started)
        logs.request_id.reset(token)


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


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every answer (SSE, background streams, upgrades) names its id."""
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers["X-Request-Id"] = rid


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as OpenAI's error shape; never a traceback."""
    from .store import StoreUnavailable

    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc)
    except StoreUnavailable as exc:
        return _error(
            RequestError(
                f"The response store is unavailable: {exc}",
                status=503,
                type="server_error",
                code="store_unavailable",
            )
        )
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        return _error(
            RequestError(
                f"The request body is too large: the limit is {limit} bytes.",
                status=413,
                code="request_too_large",
            )
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(_http_error(request, exc))
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error(
            RequestError(
                "The gateway had an internal error.",
                status=500,
                type="server_error",
                code="server_error",
            )
        )


def auth_middleware(keys: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Require `Authorization: Bearer <key>` on /v1 routes, compared in constant time."""
    encoded = [(k.encode(), client_identity(k)) for k in keys]

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            header = request.headers.get("Authorization", "")
            token = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
            ok, who = False, ""
            # compare_digest takes as long whatever the bytes, and no key ends the loop
            # early: the answer's timing says nothing about how close a guess was
            for key, identity in encoded:
                match = hmac.compare_digest(token, key)
                ok |= match
                who = identity if match else who
            request[CLIENT] = who
            if not ok or not token:
                raise RequestError(
                    "Incorrect API key provided." if token else "You didn't provide an API key.",
                    status=401,
                    code="invalid_api_key",
                )
        return await handler(request)

    return middleware


async def _start(app: web.Application) -> None:
    from .background import Background
    from .redact import RedactingUpstream
    from .store import open_store
    from .store.observed import observe_store
    from .upstream.body_budget import ByteBudget
    from .upstream.chat import ChatUpstream

    settings = app[SETTINGS]
    base_url = settings.upstream
    if not base_url:
        from .scripted_model import start_scripted_model

        runner, base_url = await start_scripted_model()
        app[SCRIPTED_RUNNER] = runner
        log.warning("no --upstream: serving the embedded scripted model at %s", base_url)
    chat = ChatUpstream(
        base_url,
        api_key=settings.upstream_api_key,
        idle_timeout=settings.idle_timeout,
        keepalive=settings.upstream_keepalive,
        client_pools=settings.upstream_client_pools,
    )
    chat.max_json_body = 4 * settings.max_output_bytes  # see JSON_BODY_LIMIT
    chat.json_budget = ByteBudget(settings.max_backend_json_bytes)
    # whatever the backend says back is scrubbed of every key this gateway knows
    upstream = RedactingUpstream(chat, (settings.upstream_api_key, *settings.client_keys()))
    store = open_store(settings.store, ttl_seconds=settings.store_ttl)
    gateway = Gateway(settings, upstream, store)
    observe_store(store, gateway.metrics.store_operations)
    gateway.background = Background(gateway)
    app[GATEWAY] = gateway


class _Shutdown:
    """The drain started when shutdown begins, awaited once the sockets are closed."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None


SHUTDOWN = web.AppKey("shutdown", _Shutdown)
# After the drain, aiohttp waits this long for any handler left, then cancels it: a
# follower of a background turn is cut there (it can resume on another instance), and
# the turn itself is ended as failed in the store on cleanup (`_stop`).
SHUTDOWN_BACKSTOP = 1.0


async def _begin_shutdown(app: web.Application) -> None:
    """SIGTERM: the listener is closed already. In-flight HTTP turns get `--shutdown-grace`
    seconds to finish, alongside the WebSocket sessions' own drain; background turns run
    on meanwhile."""
    from .http import IN_FLIGHT

    deadline = asyncio.get_running_loop().time() + app[SETTINGS].shutdown_grace
    app[SHUTDOWN].task = asyncio.create_task(app[IN_FLIGHT].drain(deadline))


async def _finish_shutdown(app: web.Application) -> None:
    task = app[SHUTDOWN].task
    if task is not None:
        await task


async def _stop(app: web.Application) -> None:
    gateway = app.get(GATEWAY)
    if gateway is not None:
        gateway.quiet.close()
        await gateway.background.close()
        await gateway.upstream.close()
        await gateway.store.close()
    runner = app.get(SCRIPTED_RUNNER)
    if runner is not None:
        await runner.cleanup()


def create_app(settings: Settings) -> web.Application:
    from . import http, retrieval, websocket

    middlewares: list = [observe_middleware, errors_middleware]
    keys = settings.client_keys()
    if keys:
        middlewares.append(auth_middleware(keys))
    limit = settings.max_header_bytes  # beyond it aiohttp answers 400 before any routing
    app = web.Application(
        middlewares=middlewares,
        client_max_size=settings.max_body_bytes,
        handler_args={"max_line_size": limit, "max_field_size": limit},
    )
    app[SETTINGS] = settings
    app.on_response_prepare.append(_add_request_id)
    app[SHUTDOWN] = _Shutdown()
    app.on_startup.append(_start)
    app.on_shutdown.append(_begin_shutdown)  # first: the deadline runs from here
    app.on_cleanup.append(_stop)
    websocket.add_routes(app)  # GET /v1/responses (upgrade) before the HTTP routes
    http.add_routes(app)
    retrieval.add_routes(app)
    app.on_shutdown.append(_finish_shutdown)  # last: after the WebSocket sessions closed
    return app


async def _freeze_startup_objects(app: web.Application) -> None:
    """What startup made (modules, the app, the gateway) lives as long as the process:
    out of the collector's sight, each full collection is ~9 ms shorter."""
    gc.collect()
    gc.freeze()


def serve(settings: Settings) -> None:
    """Run the gateway until SIGINT/SIGTERM (uvloop when available)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        uvloop = None
    logs.configure(settings.log_level)
    print(
        f"streamer: serving http://{settings.host}:{settings.port}/v1 "
        f"-> {settings.upstream or 'embedded scripted model'} (pid {os.getpid()})",
        flush=True,
    )
    app = create_app(settings)
    app.on_startup.append(_freeze_startup_objects)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        print=None,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_BACKSTOP,  # the grace is spent in the on_shutdown drain
        loop=uvloop.new_event_loop() if uvloop else None,
    )
