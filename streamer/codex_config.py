"""The Codex `config.toml` block that points Codex at a gateway (pure text building).

Codex (0.169) asks a provider's `model_catalog_url` for model metadata only when the provider
has a key (`env_key` or `experimental_bearer_token`): without one it never asks and falls back
("Model metadata for `…` not found"). So the block always carries one.
"""

from __future__ import annotations

import json

PROVIDER_ID = "streamer"
KEY_ENV = "STREAMER_CODEX_API_KEY"  # `streamer codex` sets it for Codex from the gateway's keys
NO_KEY = "unused"  # the gateway takes no key: any bearer will do


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False)


def codex_config(
    base_url: str,
    model: str,
    *,
    websockets: bool = True,
    key_env: str | None = None,
    remote_compaction: bool = False,
) -> str:
    """`model`, `model_provider` and the `[model_providers.streamer]` table, last.

    `base_url` ends in /v1; `key_env`: the environment variable holding a client key of the
    gateway (None: the gateway takes none); `remote_compaction`: name the provider "OpenAI",
    the one name for which Codex asks the server to compact (the gateway does it)."""
    key = (
        [
            f"# export {key_env}=<one of the gateway's --api-key values>",
            f"env_key = {toml_string(key_env)}",
        ]
        if key_env
        else [f"experimental_bearer_token = {toml_string(NO_KEY)}"]
    )
    lines = [
        "# Codex through streamer (streamer codex --print-config)",
        f"model = {toml_string(model)}",
        f"model_provider = {toml_string(PROVIDER_ID)}",
        "",
        f"[model_providers.{PROVIDER_ID}]",
        *(
            ['name = "OpenAI"  # Codex compacts remotely (the gateway summarises) for this name']
            if remote_compaction
            else [f"name = {toml_string(PROVIDER_ID)}"]
        ),
        f"base_url = {toml_string(base_url)}  # Codex appends /responses",
        'wire_api = "responses"',
        f"supports_websockets = {'true' if websockets else 'false'}",
        "# model metadata (context window, reasoning levels, apply_patch, ...) from the gateway;",
        "# Codex asks for it only when the provider has a key",
        f"model_catalog_url = {toml_string(base_url + '/models')}",
        *key,
    ]
    return "\n".join(lines) + "\n"
