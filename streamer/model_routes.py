"""The models a gateway serves, built from the settings: `--config FILE`, or the single-backend
flags as a config of one model. Each replica is a `ChatUpstream` (redacting), each model's
turn options are the gateway's with its own profile, tool name style and backend model.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import replace
from typing import Any

from streamer.backend_api import backend_api
from streamer.config import Settings
from streamer.models_config import ConfigError, ModelsConfig, ModelSpec, load, single
from streamer.turn import TurnOptions
from streamer.upstream.body_budget import ByteBudget
from streamer.upstream.chat.profiles import PROFILES, lowering_options
from streamer.upstream.responses.profiles import backend_tools
from streamer.upstream.router import Router

log = logging.getLogger("streamer.routing")


def load_config(settings: Settings, upstream: str | None = None) -> ModelsConfig:
    """`--config`'s models (a `ConfigError` says what is wrong), else one model on
    `upstream` (default `--upstream`)."""
    if settings.config:
        return per_worker(load(settings.config, os.environ, tuple(PROFILES)), settings.workers)
    url = upstream or settings.upstream
    assert url is not None
    return single(url, api_key=settings.upstream_api_key, model=settings.model)


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


def model_options(base: TurnOptions, settings: Settings, spec: ModelSpec) -> TurnOptions:
    """The gateway's turn options with the model's profile, name style and backend model."""
    if spec.name is None:  # the single-backend flags: the gateway's own
        return base
    from streamer.gateway import backend_profile

    profiled = replace(settings, backend_profile=spec.profile or settings.backend_profile)
    lowering = lowering_options(backend_profile(profiled), model=spec.backend_model or spec.name)
    style = spec.tool_name_style or base.naming.style
    naming = replace(base.naming, style=style)  # type: ignore[arg-type]
    api = backend_api(spec.api, backend_tools(profiled.backend_profile))
    return replace(base, naming=naming, lowering=lowering, api=api)


def build_router(
    settings: Settings, config: ModelsConfig, base: TurnOptions, secrets: tuple[str | None, ...]
) -> Router:
    """The router over `config`: one client per replica, one JSON budget for all."""
    budget = ByteBudget(settings.max_backend_json_bytes)
    keys = (*secrets, *(spec.api_key for spec in config.models))

    def build(spec: ModelSpec, url: str) -> Any:
        return chat_backend(settings, spec, url, budget, keys)

    return Router(
        config,
        build,
        lambda spec: model_options(base, settings, spec),
        queue_seconds=settings.route_queue_seconds,
        health_interval=settings.health_interval,
        affinity_entries=settings.affinity_entries,
    )


def chat_backend(
    settings: Settings,
    spec: ModelSpec,
    url: str,
    budget: ByteBudget,
    secrets: tuple[str | None, ...],
) -> Any:
    from streamer.gateway import backend_profile
    from streamer.redact import RedactingUpstream
    from streamer.upstream.http1.proxy import select_proxy
    from streamer.upstream.registry import client_class

    # the embedded model is in this process: never through a proxy
    proxied = settings.upstream or settings.config
    proxy = select_proxy(url, settings.upstream_proxy, os.environ) if proxied else None
    # the single-backend flags' model is `--upstream-api`'s; a config's model names its own
    api = settings.upstream_api if spec.name is None else spec.api
    chat = client_class(api)(
        url,
        api_key=spec.api_key,
        idle_timeout=settings.idle_timeout,
        first_byte_timeout=settings.first_byte_timeout or None,  # 0: the idle timeout
        **client_contract(settings),
        proxy=proxy,
        keepalive=settings.upstream_keepalive,
        client_pools=settings.upstream_client_pools,
    )
    chat.max_json_body = 4 * settings.max_output_bytes  # see JSON_BODY_LIMIT
    profile = replace(settings, backend_profile=spec.profile or settings.backend_profile)
    chat.stream_usage = "stream_options" not in backend_profile(profile).drop
    chat.json_budget = budget
    # whatever the backend says back is scrubbed of every key this gateway knows
    return RedactingUpstream(chat, (*secrets, *(proxy.secrets if proxy else ())))


def reread(settings: Settings) -> ModelsConfig | None:
    """SIGHUP: the file again, or None (logged) when it cannot be served."""
    try:
        return load_config(settings)
    except ConfigError as exc:
        log.error("config not reloaded, the old one is kept: %s", exc)
        return None


def client_contract(settings: Settings) -> dict[str, Any]:
    """Connect timeout, connection limit and CA file for `ChatUpstream`, checked at startup."""
    if not settings.upstream_connect_timeout > 0:
        raise ValueError("--upstream-connect-timeout must be more than 0 seconds")
    if settings.upstream_max_connections < 0:
        raise ValueError("--upstream-max-connections must be 0 (no limit) or more")
    context = None
    if settings.upstream_ca_file:
        try:  # the file's CAs instead of the system's, as curl --cacert and requests do
            context = ssl.create_default_context(cafile=settings.upstream_ca_file)
        except OSError as exc:  # ssl.SSLError too: not PEM, no certificate in it
            reason = exc.strerror or str(exc)
            raise ValueError(f"--upstream-ca-file {settings.upstream_ca_file}: {reason}") from None
    return {
        "connect_timeout": settings.upstream_connect_timeout,
        "max_connections": settings.upstream_max_connections,
        "ssl_context": context,
    }
