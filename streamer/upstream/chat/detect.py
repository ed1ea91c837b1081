"""Which backend profile fits a backend, from what it shows of itself (pure).

`fitting_profile` reads the base URL's host (hosted APIs), the response headers and the
`GET /models` answer (`owned_by` values and list shapes that self-hosted servers give
their own way). The gateway logs the result at startup when it differs from the
configured `--backend-profile` (`profile_probe`); it never changes the profile itself:
a proxy or router in front of a backend can show another's signs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

# Hosts of the hosted APIs (a subdomain matches too).
_HOSTS = (
    ("api.openai.com", "openai"),
    ("api.deepseek.com", "deepseek"),
    ("api.moonshot.ai", "kimi"),  # platform.moonshot.ai docs: base_url
    ("api.moonshot.cn", "kimi"),
    ("api.z.ai", "glm"),  # docs.z.ai: https://api.z.ai/api/paas/v4
    ("open.bigmodel.cn", "glm"),
    ("openrouter.ai", "openrouter"),  # https://openrouter.ai/api/v1
    ("api.anthropic.com", "anthropic"),  # https://api.anthropic.com/v1 (--upstream-api anthropic)
)
# Response headers only one backend sends (lower-case names).
_HEADERS = (
    # platform.openai.com/docs/api-reference/debugging-requests: on every API response
    ("openai-organization", "openai"),
    ("openai-processing-ms", "openai"),
    # docs.anthropic.com/en/api/overview, "Response headers": on every API response
    ("anthropic-organization-id", "anthropic"),
    ("x-litellm-version", "litellm"),  # the LiteLLM proxy's own, on its answers
)
# `owned_by` of the models in `GET /v1/models`, as each server fills it in.
_OWNERS = (
    ("vllm", "vllm"),  # vllm/entrypoints/openai/protocol.py: ModelCard.owned_by = "vllm"
    ("sglang", "sglang"),  # sglang/srt/entrypoints/openai/protocol.py: ModelCard
    ("llamacpp", "llamacpp"),  # tools/server/server.cpp: handle_models
    ("organization_owner", "lmstudio"),  # LM Studio (JetBrains/koog#139)
    ("library", "ollama"),  # ollama openai/openai.go: the model name's namespace
    ("deepseek", "deepseek"),  # api-docs.deepseek.com/api/list-models (its example)
)
# Fields of a model entry that only OpenRouter's list has (openrouter.ai/docs: "Models").
_OPENROUTER_FIELDS = ("canonical_slug", "pricing", "top_provider")
# Anthropic's `GET /v1/models` entries: `{"type": "model", "id", "display_name", "created_at"}`
# (the SDK's ModelInfo), where OpenAI-shaped lists have `object` and `owned_by`.
_ANTHROPIC_FIELDS = ("display_name", "created_at")
_MAX_MODELS = 64  # model entries looked at


@dataclass(frozen=True, slots=True)
class Fit:
    profile: str
    reason: str
    """What showed it, for the log (`owned_by "vllm" in GET /models`)."""


def fitting_profile(
    base_url: str, headers: Mapping[str, str], status: int, body: bytes
) -> Fit | None:
    """The profile that fits the backend at `base_url`, from its `GET /models` answer
    (`status`, `headers`, `body`); None if nothing says."""
    host = (urlsplit(base_url).hostname or "").lower()
    for suffix, profile in _HOSTS:
        if host == suffix or host.endswith("." + suffix):
            return Fit(profile, f"the host {host}")
    names = {name.lower() for name in headers}
    for header, profile in _HEADERS:
        if header in names:
            return Fit(profile, f"the {header} header")
    if not 200 <= status < 300:
        return None
    try:
        listing: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _from_listing(listing) if isinstance(listing, dict) else None


def _from_listing(listing: Mapping[str, Any]) -> Fit | None:
    data = listing.get("data")
    models = (
        [m for m in data[:_MAX_MODELS] if isinstance(m, dict)] if isinstance(data, list) else []
    )
    owners = {m.get("owned_by") for m in models}
    for owner, profile in _OWNERS:
        if owner in owners:
            return Fit(profile, f'owned_by "{owner}" in GET /models')
    if any(all(field in m for field in _OPENROUTER_FIELDS) for m in models):
        return Fit("openrouter", "OpenRouter's model fields in GET /models")
    if any(m.get("type") == "model" and all(f in m for f in _ANTHROPIC_FIELDS) for m in models):
        return Fit("anthropic", "Anthropic's model entries in GET /models")
    return None
