"""The aiohttp application: routes, middlewares, startup and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from streamer import fd_budget, logs, tracing
from streamer.config import NO_RELOAD, Settings
from streamer.core import speed
from streamer.core.model_metadata import load_model_catalog
from streamer.early_signals import catch_early
from streamer.frontends.api_keys import ApiKeys
from streamer.frontends.endpoint import Decorations, Endpoint
from streamer.frontends.fast_http import FAST_ROUTE, FastRoute, same_parser
from streamer.frontends.frontdoor import FRONT_DOOR, FrontDoor, GuardedSite, door_middleware
from streamer.frontends.http import DECORATIONS, ENDPOINT, GATEWAY, LEASES, MODEL_CATALOG
from streamer.frontends.middlewares import (
    auth_middleware,
    decorate,
    errors_middleware,
    expect_rules,
    observe_middleware,
)
from streamer.stopping import DRAINING, Draining, serve_until_signalled
from streamer.turns.gateway import Gateway

if TYPE_CHECKING:
    from streamer.turns.router import Router
    from streamer.upstream.chat.profile_probe import ProfileProbe
    from streamer.worker import Seat

log = logging.getLogger("streamer.app")

SETTINGS = web.AppKey("settings", Settings)
FD_BUDGET = web.AppKey("fd_budget", fd_budget.FdBudget)

SCRIPTED_RUNNER = web.AppKey("scripted_runner", web.AppRunner)
PROFILE_PROBE: web.AppKey[ProfileProbe] = web.AppKey("profile_probe")
SIGHUP = web.AppKey("sighup", bool)  # the SIGHUP handler is installed (removed at cleanup)


class Reloads:
    """SIGHUPs handled (`seen`) and the reloads still swapping their table in (`tasks`)."""

    __slots__ = ("seen", "tasks")

    def __init__(self) -> None:
        self.seen = 0
        self.tasks: set[asyncio.Future[None]] = set()


RELOADS = web.AppKey("reloads", Reloads)


async def _close_while_draining(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: in the drain window (stopping.py) every answer asks to close
    its connection, so a load balancer's next request opens one elsewhere."""
    if request.app[DRAINING].open:  # the hook runs once aiohttp wrote its Connection header
        response.force_close()
        response.headers["Connection"] = "close"


async def _start(app: web.Application) -> None:
    from streamer.frontends.background import Background
    from streamer.frontends.background_caps import TurnCaps
    from streamer.store.observed import observe_store
    from streamer.store_setup import open_gateway_store
    from streamer.turns.model_routes import build_router, load_config
    from streamer.turns.options import turn_options
    from streamer.turns.registry import UpstreamRegistry
    from streamer.upstream.http1.connection_limit import OpenConnections

    # the store first: it may keep the state key the turn options seal with
    store, settings, answered = await open_gateway_store(app[SETTINGS])
    budget = app[FD_BUDGET]
    base_url = settings.upstream
    if not base_url and not settings.config:
        from streamer.scripted_model import start_scripted_model

        runner, base_url = await start_scripted_model()
        app[SCRIPTED_RUNNER] = runner
        log.warning("no --upstream: serving the embedded scripted model at %s", base_url)
    options = turn_options(settings)
    secrets = (settings.upstream_api_key, *settings.client_keys())
    config = load_config(settings, base_url)
    router = build_router(settings, config, options, secrets, OpenConnections(budget.backend))
    background = Background(
        store,
        store_wait=settings.background_store_wait,
        cancel_wait=settings.background_cancel_wait,
        caps=TurnCaps(budget.background, budget.background_per_client),
        lease=settings.background_lease,
        keep_for=settings.store_ttl,
    )
    upstreams = UpstreamRegistry(router)
    gateway = Gateway(settings, upstreams, store, background, options=options)
    if not answered:
        gateway.store_health.wrote(False)
    catalog = app[MODEL_CATALOG] = load_model_catalog(settings.model_metadata)
    gateway.metrics.know_models(_model_labels(config, catalog))
    router.metrics = gateway.metrics
    metrics = gateway.metrics
    observe_store(store, metrics.store_operations, metrics.store_incomplete, tracing.span)
    app[GATEWAY] = gateway
    app[LEASES] = background.leases
    router.start()
    background.leases.start_sweeping()  # the turns of instances that stopped: ended failed
    if settings.config:
        _on_sighup(app, router)
    else:
        _ignore_sighup(app)
    if settings.upstream and settings.profile_probe:  # which profile fits: in the log
        from streamer.upstream.chat.profile_probe import ProfileProbe

        app[PROFILE_PROBE] = ProfileProbe(upstreams.chat(), settings.backend_profile)
    _open_endpoint(app, gateway)


def _model_labels(config: Any, catalog: Any) -> list[str]:
    """The models metrics name (any other is `other`): the config's and the catalog's."""
    return [*(spec.label for spec in config.models), *catalog.models]


def _open_endpoint(app: web.Application, gateway: Gateway) -> None:
    """The endpoint both servers use, and (`--fast-http`) the fast path over it."""
    settings = app[SETTINGS]
    keys = settings.client_keys()
    endpoint = Endpoint(gateway, ApiKeys(keys) if keys else None, app[DECORATIONS])
    app[ENDPOINT] = endpoint
    if not settings.fast_http:
        return
    if not same_parser():
        log.warning("--fast-http is off: aiohttp runs without its C parser (llhttp)")
        return
    app[FAST_ROUTE] = FastRoute(endpoint, settings, app[DRAINING])


def _on_sighup(app: web.Application, router: Router) -> None:
    """SIGHUP reloads `--config`: new turns use it, turns in flight finish on the old one;
    a file that cannot be served is logged and the old config kept."""
    from streamer.turns.model_routes import reread

    settings = app[SETTINGS]

    reloads = app[RELOADS] = Reloads()

    def reload() -> None:
        config = reread(settings)
        if config is not None:
            gateway = app[GATEWAY]
            gateway.metrics.know_models(_model_labels(config, app[MODEL_CATALOG]))
            task = asyncio.ensure_future(router.reload(config))
            reloads.tasks.add(task)
            task.add_done_callback(reloads.tasks.discard)
        reloads.seen += 1

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        app[SIGHUP] = True


def _ignore_sighup(app: web.Application) -> None:
    """Without `--config` SIGHUP (logrotate, `systemctl reload`) reloads nothing: it is
    logged and ignored, where its default action would end the process without a word."""
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, log.warning, NO_RELOAD)
        app[SIGHUP] = True


# After the drain, aiohttp waits this long for any handler left, then cancels it: a
# follower of a background turn is cut there (it can resume on another instance).
SHUTDOWN_BACKSTOP = 1.0


async def _shutdown(app: web.Application) -> None:
    """SIGTERM (the listener is closed already): the one drain. From here no new turn is
    taken; the turns in flight on every transport (HTTP handlers, the fast path, WebSocket
    lanes, background turns: all in `Gateway.in_flight`) get `--shutdown-grace` seconds
    to finish, then `Gateway.run` ends each one left alike. The WebSocket sockets close
    after it (1001, their own on_shutdown hook)."""
    gateway = app.get(GATEWAY)
    if gateway is None:  # the startup failed
        return
    deadline = asyncio.get_running_loop().time() + app[SETTINGS].shutdown_grace
    fast = app.get(FAST_ROUTE)
    if fast is not None:  # as aiohttp's pre_shutdown does with its own connections
        fast.shutdown()
    await gateway.in_flight.drain(deadline)


async def _stop(app: web.Application) -> None:
    if app.get(SIGHUP):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        with contextlib.suppress(ValueError):  # not the main thread: nothing was installed
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # not its default action (the end)
    reloads = app.get(RELOADS)
    if reloads is not None and reloads.tasks:
        await asyncio.gather(*reloads.tasks)
    probe = app.get(PROFILE_PROBE)
    if probe is not None:
        await probe.close()
    gateway = app.get(GATEWAY)
    if gateway is not None:
        await gateway.close()
    if tracing.enabled():  # what the exporter holds still goes out (off the loop)
        await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)
    runner = app.get(SCRIPTED_RUNNER)
    if runner is not None:
        await runner.cleanup()


def check_settings(settings: Settings) -> None:
    """Refuse, before serving, settings the front door cannot work with (ValueError)."""
    if settings.client_header_timeout <= 0 or settings.client_body_timeout <= 0:
        raise ValueError("--client-header-timeout and --client-body-timeout must be > 0")
    if settings.drain_seconds < 0:
        raise ValueError("--drain-seconds must be 0 or more")
    if settings.background_lease <= 0:
        raise ValueError("--background-lease must be > 0 (seconds)")
    if settings.metrics_auth and not settings.client_keys():
        raise ValueError("--metrics-auth needs client keys (--api-key or --api-key-file)")
    load_model_catalog(settings.model_metadata)  # a wrong file stops the gateway here
    tracing.check()  # OTEL_* asking for traces this gateway cannot send
    speed.parse_reference(settings.reference)
    from streamer.turns.model_routes import check_config

    check_config(settings)  # --config: the file, its line and what is wrong
    from streamer.supervisor import check_workers

    check_workers(settings)
    from streamer.store import check_spec
    from streamer.turns.options import store_options

    check_spec(settings.store, settings.store_key_prefix)  # the URL, before any connection
    store_options(settings)  # the TLS files
    from streamer.upstream.kinds import KINDS

    kind = KINDS.get(settings.upstream_api)
    if kind is None:
        names = " or ".join(KINDS)
        raise ValueError(f"--upstream-api must be {names}, not {settings.upstream_api!r}")
    if not kind.embedded and not (settings.upstream or settings.config):
        raise ValueError(
            f"--upstream-api {kind.name} needs --upstream (the embedded model is Chat)"
        )


def create_app(settings: Settings) -> web.Application:
    from streamer.frontends import conversations, http, input_tokens, retrieval, websocket

    check_settings(settings)
    speed.use_reference(settings.reference)  # this process's hot path, before any stream
    budget = fd_budget.for_settings(settings, open_file_limit())
    if budget.over:
        log.warning("the caps ask for more descriptors than the limit has: %s", budget.describe())
    log.info("fd budget: %s", budget.describe())
    front = FrontDoor(budget.clients, settings.client_header_timeout)
    middlewares: list = [door_middleware(front), observe_middleware, errors_middleware]
    if settings.client_keys() or settings.forward_authorization:
        middlewares.append(auth_middleware(metrics=settings.metrics_auth))
    limit = settings.max_header_bytes  # beyond it aiohttp answers 400 before any routing
    app = web.Application(
        middlewares=middlewares,
        client_max_size=settings.max_body_bytes,
        handler_args={
            "max_line_size": limit,
            "max_field_size": limit,
            # bodies are decoded by the endpoint, which counts their decoded size as it goes
            "auto_decompress": False,
            # the rest of a body refused before it was read: dropped as it comes, so long
            "lingering_time": settings.client_body_timeout,
        },
    )
    app[SETTINGS] = settings
    app[FD_BUDGET] = budget
    app[FRONT_DOOR] = front
    app[DRAINING] = Draining()
    app[DECORATIONS] = Decorations()
    app.on_response_prepare.append(decorate)
    app.on_response_prepare.append(_close_while_draining)
    app.on_startup.append(_start)
    app.on_shutdown.append(_shutdown)  # first: the drain, before the sockets close
    app.on_cleanup.append(_stop)
    app.on_cleanup.append(_close_door)
    websocket.add_routes(app)  # GET /v1/responses (upgrade) before the HTTP routes
    http.add_routes(app)
    retrieval.add_routes(app)
    conversations.add_routes(app)
    input_tokens.add_routes(app)  # POST /v1/responses/input_tokens
    expect_rules(app.router, metrics=settings.metrics_auth)  # every route's, once all are in
    return app


async def _close_door(app: web.Application) -> None:
    app[FRONT_DOOR].close()
    fast = app.get(FAST_ROUTE)
    if fast is not None:
        fast.close()


def open_file_limit(*, raise_soft: bool = False) -> int:
    """RLIMIT_NOFILE's soft limit, which the fd budget shares out; `raise_soft`: first
    raised to the hard limit, as servers do (the hard one is the administrator's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_soft and soft != hard:
        with contextlib.suppress(ValueError, OSError):  # e.g. an infinite hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def _freeze_startup_objects(app: web.Application) -> None:
    """What startup made (modules, the app, the gateway) lives as long as the process:
    out of the collector's sight, each full collection is ~9 ms shorter. A turn allocates
    a few objects per event, nearly all freed at once by their count: a young generation of
    20,000 (not 700) makes collections rarer (-3% instructions per one-token turn,
    measured with callgrind) for at most a few MB of cyclic garbage waiting longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)


async def _run(app: web.Application, settings: Settings, worker: Seat | None) -> None:
    """Serve `app` behind the front door until SIGINT/SIGTERM, then stop (stopping.py:
    the drain window, then the shutdown)."""
    runner = web.AppRunner(
        app,
        handle_signals=False,  # stopping.py's, with the drain window
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_BACKSTOP,  # the grace is spent in the on_shutdown drain
    )
    await runner.setup()  # a SIGTERM meanwhile is kept (`catch_early`)
    site = worker.site(runner) if worker else GuardedSite(runner, settings.host, settings.port)
    await serve_until_signalled(runner, site, app[DRAINING], settings.drain_seconds)


def serve(settings: Settings, worker: Seat | None = None) -> None:
    """Run the gateway until SIGINT/SIGTERM (uvloop when available); `worker`: as one of
    `--workers N` (`streamer.worker`)."""
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    from streamer.turns.model_routes import serving_target

    catch_early()  # a SIGTERM while starting: kept, acted on once serving
    logs.configure(settings.log_level, settings.access_log)
    tracing.configure()  # off unless OTEL_* asks (each worker its own exporter)
    print(
        f"streamer: serving http://{settings.host}:{settings.port}/v1 "
        f"-> {serving_target(settings)} (pid {os.getpid()})",
        flush=True,
    )
    open_file_limit(raise_soft=True)  # before create_app shares it out
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until startup handles it (`_ignore_sighup`)
    app = create_app(settings)
    if worker is not None:
        worker.attach(app, app[DECORATIONS])
    app.on_startup.append(_freeze_startup_objects)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(_run(app, settings, worker))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError, web.GracefulExit):
                loop.run_until_complete(main)
        _cancel_rest(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> None:
    """What is left once the runner is cleaned up (as `web.run_app` does)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
