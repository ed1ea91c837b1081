"""The request fields besides input and tools: checked, forwarded where the backend takes
them, and echoed as applied (pure).

What a backend takes is data (`LoweringOptions.accepts`, from its profile): `logprobs`
(with `top_logprobs`), `verbosity`, `service_tier`, `metadata`, and the cache hint
`prompt_cache_key` (OpenAI's name) or `cache_salt` (vLLM's: an isolation key, so no
profile maps to it by default). `user`, or else `safety_identifier`, is sent as `user`
unless the profile drops it. Logprobs the backend cannot give are a 400; the hints
(verbosity, service tier) are echoed as what was applied, not as what was asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.core.errors import RequestError, invalid

LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = frozenset(
    {
        LOGPROBS,
        # nothing to add: the gateway runs no hosted tools, its input images stay as sent,
        # and its reasoning is readable (replayed from the items themselves)
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
MAX_TOP_LOGPROBS = 20
VERBOSITIES = ("low", "medium", "high")
OPTIONAL_PARAMS = frozenset(
    {"logprobs", "verbosity", "service_tier", "metadata", "prompt_cache_key", "cache_salt"}
)
"""The Chat parameters a profile may say its backend takes (`accepts`)."""
UNSUPPORTED = (
    # ignoring these would change what the client gets: blocked content let through, a
    # context that grows past the window instead of being compacted
    ("moderation", "Moderation is not supported by this gateway."),
    (
        "context_management",
        "Server-side compaction ('context_management') is not supported by this gateway; "
        "use truncation: 'auto'.",
    ),
)


def _bad_value(param: str, value: Any, allowed: str) -> RequestError:
    return invalid(f"Invalid value for '{param}': {value!r}. {allowed}", param, "invalid_value")


def check_fields(request: Mapping[str, Any]) -> None:
    """Values the Responses API rejects (types were checked before), and fields this gateway
    cannot honour, as OpenAI's 400s. Service tiers are not checked: new ones keep coming,
    and the echo says the tier that served the request."""
    for name, message in UNSUPPORTED:
        if request.get(name) is not None:
            raise invalid(message, name, "unsupported_parameter")
    include = request.get("include") or []
    for i, value in enumerate(include):
        if not isinstance(value, str) or value not in INCLUDABLE:
            supported = ", ".join(sorted(INCLUDABLE))
            raise _bad_value(f"include[{i}]", value, f"Supported values are: {supported}.")
    text = request.get("text")
    verbosity = text.get("verbosity") if isinstance(text, Mapping) else None
    if verbosity is not None and verbosity not in VERBOSITIES:
        raise _bad_value("text.verbosity", verbosity, "Supported values are: low, medium, high.")


def wants_logprobs(request: Mapping[str, Any]) -> bool:
    return LOGPROBS in (request.get("include") or ()) or (request.get("top_logprobs") or 0) > 0


def forwarded(
    request: Mapping[str, Any], accepts: frozenset[str], profile: str = ""
) -> dict[str, Any]:
    """The Chat fields for the request's logprobs, identifiers and hints (before `drop`)."""
    out: dict[str, Any] = {}
    if wants_logprobs(request):
        if "logprobs" not in accepts:
            param = "include" if LOGPROBS in (request.get("include") or ()) else "top_logprobs"
            raise invalid(
                f"Logprobs are not supported by this gateway's backend{_named(profile)}.",
                param,
                "unsupported_parameter",
            )
        out["logprobs"] = True
        if request.get("top_logprobs"):
            out["top_logprobs"] = request["top_logprobs"]
    user = request.get("user") or request.get("safety_identifier")
    if isinstance(user, str) and user:
        out["user"] = user
    key = request.get("prompt_cache_key")
    if key:
        for name in ("prompt_cache_key", "cache_salt"):
            if name in accepts:
                out[name] = key
                break
    text = request.get("text")
    verbosity = text.get("verbosity") if isinstance(text, Mapping) else None
    for name, value in (
        ("verbosity", verbosity),
        ("service_tier", request.get("service_tier")),
        ("metadata", request.get("metadata")),
    ):
        if value and name in accepts:
            out[name] = value
    return out


def _named(profile: str) -> str:
    return f" (backend profile {profile!r})" if profile else ""


def echo_applied(response: dict[str, Any], chat: Mapping[str, Any]) -> None:
    """The Response's hints as applied: the verbosity sent (the backend's own, `medium`,
    if none was), and the `default` service tier until the backend reports the one that
    served it (`ServiceTier`)."""
    text = response.get("text")
    if isinstance(text, dict):
        text["verbosity"] = chat.get("verbosity") or "medium"
    response["service_tier"] = "default"
