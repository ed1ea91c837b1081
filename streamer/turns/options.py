"""Settings -> options, once: the gateway's turn options and each model's.

A model is the single-backend flags (`--upstream`, `--upstream-api`, `--backend-profile`,
`--model`: a config of one catch-all model, streamer/core/models_config.py `single`) or a
`--config` entry; either way `model_options` gives its options from the same settings by
the same steps: its kind (`api`), its backend profile (`profile`, else `--backend-profile`,
with every profile setting's flag laid over it: `backend_profile`, the one place a profile
is resolved), the lowering that profile and kind ask for, its tool name style and backend
model. `client_options` are what every backend client is built with, checked once at startup.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from streamer.config import PROFILE_SETTINGS, SETTINGS, Setting, Settings
from streamer.core.mcp_hosts import HostRule
from streamer.core.mcp_loop import McpLimits
from streamer.core.model_catalog import output_limits
from streamer.core.model_metadata import load_model_catalog
from streamer.core.models_config import TOOL_NAME_STYLES, ModelSpec
from streamer.core.sealing import EPHEMERAL_KEY, Sealer, load_sealer
from streamer.core.tools import NamingConfig
from streamer.mcp.client import McpSettings
from streamer.turns.history_reuse import HistoryCache
from streamer.turns.turn import TurnOptions
from streamer.upstream.chat.profiles import PROFILES, BackendProfile, lowering_options, resolve
from streamer.upstream.kind import BackendKind
from streamer.upstream.kinds import kind_named

log = logging.getLogger("streamer.gateway")


def backend_profile(settings: Settings, name: str | None = None) -> BackendProfile:
    """The profile `name` (None: `--backend-profile`) with each of its settings' own flags
    laid over it (streamer/config.py, `PROFILE_SETTINGS`)."""
    given = {key: getattr(settings, name) for name, key in PROFILE_SETTINGS.items()}
    if not settings.replay_reasoning:  # --replay-reasoning off (deprecated) still means off
        given["reasoning_replay"] = "off"
    return resolve(name or settings.backend_profile, **given)


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """One model's options: what its turns are prepared with, and its resolved profile."""

    turn: TurnOptions = field(default_factory=TurnOptions)
    profile: BackendProfile = PROFILES["generic"]

    @property
    def kind(self) -> BackendKind:
        return self.turn.kind


def turn_options(settings: Settings) -> TurnOptions:
    """The gateway's turn options: limits, naming, the sealer; lowered for the flags' model
    (a `--config` model's own are `model_options`). A ValueError for a setting that
    cannot work."""
    if settings.tool_name_style not in TOOL_NAME_STYLES:
        raise ValueError(f"unknown tool name style {settings.tool_name_style!r}")
    if settings.history_cache_bytes < 0:
        raise ValueError("--history-cache-bytes must be 0 (none) or more")
    for flag, value in (
        ("--max-output-bytes", settings.max_output_bytes),
        ("--max-output-items", settings.max_output_items),
        ("--max-turn-seconds", settings.max_turn_seconds),
        ("--max-backend-json-bytes", settings.max_backend_json_bytes),
    ):
        if not value > 0:  # 0 would refuse every turn, not lift the limit: say so now
            raise ValueError(f"{flag} must be positive (got {value!r})")
    base = TurnOptions(
        naming=NamingConfig(
            style=settings.tool_name_style,  # type: ignore[arg-type]
            max_name_length=settings.max_tool_name_length,
            max_tools=settings.max_tools,
            max_tool_bytes=settings.max_tool_bytes,
        ),
        max_input_items=settings.max_input_items,
        max_output_bytes=settings.max_output_bytes,
        max_output_items=settings.max_output_items,
        max_turn_seconds=settings.max_turn_seconds,
        sealer=state_sealer(settings.state_key_file, settings.shared_state_key),
        mcp=mcp_limits(settings),
        optional_hosted=frozenset(settings.optional_hosted_tool),
        history=HistoryCache(settings.history_cache_bytes)
        if settings.history_cache_bytes
        else None,
    )
    flags = ModelSpec(None, (), api=settings.upstream_api, backend_model=settings.model)
    return model_options(settings, flags, base).turn


def mcp_limits(settings: Settings) -> McpLimits | None:
    """The remote MCP loop's bounds (`--mcp-*`); None for `--mcp off`."""
    if settings.mcp not in ("on", "off"):
        raise ValueError(f"--mcp must be on or off (got {settings.mcp!r})")
    if not settings.mcp_max_calls > 0 or not settings.mcp_timeout > 0:
        raise ValueError("--mcp-max-calls and --mcp-timeout must be positive")
    if settings.mcp == "off":
        return None
    return McpLimits(settings.mcp_max_calls, settings.mcp_max_output_bytes, settings.mcp_timeout)


def mcp_settings(settings: Settings) -> McpSettings:
    """The MCP client's settings: the `--mcp-allow` rule (a ValueError for a bad pattern),
    its timeout, its bounds and its tool-list cache."""
    return McpSettings(
        HostRule.parse(settings.mcp_allow),
        settings.mcp_timeout,
        settings.mcp_max_tools,
        settings.mcp_max_list_bytes,
        settings.mcp_max_output_bytes,
        settings.mcp_cache_seconds,
        settings.mcp_cache_entries,
    )


def model_options(settings: Settings, spec: ModelSpec, base: TurnOptions) -> ModelOptions:
    """`spec`'s options: the gateway's `base` with the model's kind, profile, lowering,
    tool name style and backend model (the flags' model: `--upstream-api`, `--model`)."""
    if spec.settings:  # what the model sets for itself, as if the gateway's flags said it
        settings = replace(settings, **dict(spec.settings))
    kind = kind_named(spec.api)
    profile = backend_profile(settings, spec.profile)
    lowering = lowering_options(
        profile, model=spec.backend_model or spec.name, tools=kind.tools(profile.name)
    )
    lowering = replace(lowering, **_output_limits(settings, spec))
    naming = replace(base.naming, style=spec.tool_name_style or base.naming.style)  # type: ignore[arg-type]
    return ModelOptions(replace(base, naming=naming, lowering=lowering, kind=kind), profile)


def _output_limits(settings: Settings, spec: ModelSpec) -> dict[str, Any]:
    """The model's `max_output_tokens`: its `--config` entry's, else its `--model-metadata`
    entry's, else that file's defaults; for the catch-all model, each entry's by name."""
    default, own = output_limits(load_model_catalog(settings.model_metadata))
    if spec.name is None:
        return {"max_output_tokens": default, "output_limits": tuple(own.items())}
    return {"max_output_tokens": spec.max_output_tokens or own.get(spec.name) or default}


def model_knobs() -> dict[str, Callable[[Any], Any]]:
    """The settings a `--config` model may set for itself, by their names: its profile's
    (`system_messages`, `reasoning_efforts`, `drop_params`, …), each checked as its flag is."""
    return {s.dest: partial(_knob, s) for s in SETTINGS if s.profile is not None}


def _knob(setting: Setting, value: Any) -> Any:
    if setting.boolean and not isinstance(value, bool):
        raise ValueError("expected a boolean")
    if not setting.boolean and not isinstance(value, str):
        raise ValueError("expected a string")
    assert setting.profile is not None
    resolve("generic", **{setting.profile: value})  # the profile's own check (a ValueError)
    return value


def client_options(settings: Settings) -> dict[str, Any]:
    """What every backend client is built with (`BackendClient`'s keywords), checked at
    startup: connect, first-byte and idle timeouts, the connection limit and CA file,
    keep-alive and its pools, the whole-JSON cap."""
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
        "idle_timeout": settings.idle_timeout,
        "first_byte_timeout": settings.first_byte_timeout or None,  # 0: the idle timeout
        "keepalive": settings.upstream_keepalive,
        "client_pools": settings.upstream_client_pools,
        "max_json_body": 4 * settings.max_output_bytes,  # see JSON_BODY_LIMIT
    }


def store_options(settings: Settings) -> dict[str, Any]:
    """What `open_store` is given for `--store`: the TTL, the per-operation timeout, the
    byte bound (memory, SQLite), and for Redis the key prefix and TLS files, checked here."""
    for flag, path in (
        ("--store-tls-ca-file", settings.store_tls_ca_file),
        ("--store-tls-cert-file", settings.store_tls_cert_file),
        ("--store-tls-key-file", settings.store_tls_key_file),
    ):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if settings.store_max_bytes < 1:
        raise ValueError("--store-max-bytes must be 1 or more")
    options: dict[str, Any] = {
        "ttl_seconds": settings.store_ttl,
        "timeout": settings.store_timeout,
        "max_bytes": settings.store_max_bytes,
        "key_prefix": settings.store_key_prefix,
    }
    tls = (settings.store_tls_ca_file, settings.store_tls_cert_file, settings.store_tls_key_file)
    if any(tls):
        if not settings.store.startswith(("rediss://", "rediss+")):
            raise ValueError("the --store-tls-* settings need a TLS store URL (rediss://…)")
        from streamer.store.redis_connect import TLS

        options["tls"] = TLS(*tls)
    return options


def state_sealer(path: str | None, shared: bytes | None = None) -> Sealer:
    """The sealer of `--state-key-file`, else of the key a `--workers` supervisor shares
    among its workers; without either a random key (the log says so, at startup and when
    it first seals something)."""
    sealer = Sealer.from_secret(shared) if shared and not path else load_sealer(path)
    if sealer.ephemeral:
        log.info("no --state-key-file: %s", EPHEMERAL_KEY)
    return sealer
