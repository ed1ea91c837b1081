"""The models a gateway serves, built from the settings: `--config FILE`, or the single-backend
flags as a config of one model. Each model's options come from streamer/turns/options.py (its kind,
profile, lowering, tool name style and backend model); each replica is the shared backend
client over its kind's wire (redacting).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from streamer.config import Settings
from streamer.core.models_config import ConfigError, ModelsConfig, ModelSpec, load, single
from streamer.turns.options import ModelOptions, client_options, model_knobs, model_options
from streamer.turns.router import Router
from streamer.turns.turn import TurnOptions
from streamer.upstream.body_budget import ByteBudget
from streamer.upstream.chat.profiles import PROFILES
from streamer.upstream.http1.connection_limit import OpenConnections
from streamer.upstream.kinds import KINDS

log = logging.getLogger("streamer.routing")


def load_config(settings: Settings, upstream: str | None = None) -> ModelsConfig:
    """`--config`'s models (a `ConfigError` says what is wrong), else one model on
    `upstream` (default `--upstream`)."""
    if settings.config:
        kinds = tuple(KINDS)
        config = load(settings.config, os.environ, tuple(PROFILES), kinds, knobs=model_knobs())
        return per_worker(config, settings.workers)
    url = upstream or settings.upstream
    assert url is not None
    return single(
        url, api_key=settings.upstream_api_key, model=settings.model, api=settings.upstream_api
    )


def per_worker(config: ModelsConfig, workers: int) -> ModelsConfig:
    """Each of `--workers N` holds its share of every model's `max_concurrency` (as of
    `--upstream-max-connections`): the limit stays one across the gateway."""
    if workers <= 1:
        return config
    models = tuple(
        replace(m, max_concurrency=max(1, m.max_concurrency // workers)) if m.max_concurrency else m
        for m in config.models
    )
    return replace(config, models=models)


def serving_target(settings: Settings) -> str:
    """What the startup line names behind the gateway: `--upstream`, `--config`'s models with
    their replicas and kinds, or the embedded scripted model."""
    if settings.upstream:
        return settings.upstream
    if not settings.config:
        return "embedded scripted model"
    try:
        config = load_config(settings)
    except ConfigError as exc:
        return f"{settings.config} ({exc})"
    models = (f"{m.label} ({m.api}) -> {', '.join(m.upstreams)}" for m in config.models)
    return f"{settings.config}: {'; '.join(models)}"


def check_config(settings: Settings) -> None:
    """Startup: a config that cannot be served stops the gateway (ValueError)."""
    if settings.config:
        if settings.upstream:
            raise ValueError("--config and --upstream are exclusive: put upstreams in the file")
        load_config(settings)
    for flag, value in (
        ("--route-queue-seconds", settings.route_queue_seconds),
        ("--health-interval", settings.health_interval),
        ("--affinity-entries", settings.affinity_entries),
    ):
        if value < 0:
            raise ValueError(f"{flag} must be 0 or more (got {value!r})")


def build_router(
    settings: Settings,
    config: ModelsConfig,
    base: TurnOptions,
    secrets: tuple[str | None, ...],
    open_connections: OpenConnections | None = None,
) -> Router:
    """The router over `config`: each model's options once, one client per replica, one
    JSON budget for all, and one cap on the backend connections open (`open_connections`,
    from the fd budget)."""
    budget = ByteBudget(settings.max_backend_json_bytes)
    keys = (*secrets, *(spec.api_key for spec in config.models))
    client = client_options(settings)
    shared = {"json_budget": budget, "open_connections": open_connections}

    def build(spec: ModelSpec, url: str, options: ModelOptions) -> Any:
        return backend(settings, spec, url, options, {**client, **shared}, keys)

    return Router(
        config,
        build,
        lambda spec: model_options(settings, spec, base),
        queue_seconds=settings.route_queue_seconds,
        health_interval=settings.health_interval,
        affinity_entries=settings.affinity_entries,
    )


def backend(
    settings: Settings,
    spec: ModelSpec,
    url: str,
    options: ModelOptions,
    client: dict[str, Any],
    secrets: tuple[str | None, ...],
) -> Any:
    """One replica's client: its model's kind and profile on the wire, scrubbed of every
    key this gateway knows."""
    from streamer.upstream.backend_client import BackendClient
    from streamer.upstream.http1.proxy import select_proxy
    from streamer.upstream.redact import RedactingUpstream

    # the embedded model is in this process: never through a proxy
    proxied = settings.upstream or settings.config
    proxy = select_proxy(url, settings.upstream_proxy, os.environ) if proxied else None
    wire = options.kind.wire(options.profile)
    # whatever the backend says back is scrubbed of every key this gateway knows: by the
    # client where its words enter the gateway's own, by the wrapper where they pass through
    known = (*secrets, *(proxy.secrets if proxy else ()))
    upstream = BackendClient(url, wire, api_key=spec.api_key, proxy=proxy, secrets=known, **client)
    return RedactingUpstream(upstream, known)


def reread(settings: Settings) -> ModelsConfig | None:
    """SIGHUP: the file again, or None (logged) when it cannot be served."""
    try:
        return load_config(settings)
    except ConfigError as exc:
        log.error("config not reloaded, the old one is kept: %s", exc)
        return None
