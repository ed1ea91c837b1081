"""A turn's spans as the OpenTelemetry GenAI semantic conventions name them.

`TurnTrace` is made only when tracing is on (streamer/tracing.py): the turn's span (kind
SERVER, `chat {model}`), current while the turn runs so that the backend attempts, store
operations and MCP calls under it are its children; for a compaction turn a `compaction`
span between. The attributes are built from the turn's plain values here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from streamer import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from streamer.turns.turn import Turn

OPERATION = "chat"  # a Responses turn is a chat completion in the conventions' words
PROVIDERS = {"chat": "openai", "responses": "openai", "anthropic": "anthropic"}

_REQUEST_FIELDS = (
    ("max_output_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
)
_BACKEND_FIELDS = (
    ("max_tokens", "gen_ai.request.max_tokens"),
    ("max_completion_tokens", "gen_ai.request.max_tokens"),
    ("max_output_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
)
_TOOL_CALLS = frozenset({"function_call", "custom_tool_call"})


def _copied(request: Mapping[str, Any], fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, name in fields:
        value = request.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[name] = value
    return found


def turn_attributes(turn: Turn, transport: str) -> dict[str, Any]:
    """What is known of a turn when it starts."""
    request = turn.request
    attributes = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDERS.get(turn.kind.name, turn.kind.name),
        "gen_ai.request.model": str(request.get("model") or turn.response.get("model") or ""),
        "streamer.transport": transport,
        **_copied(request, _REQUEST_FIELDS),
    }
    if turn.conversation:
        attributes["gen_ai.conversation.id"] = turn.conversation
    return attributes


def finish_reasons(response: Mapping[str, Any]) -> list[str]:
    """The response's end in the conventions' words: stop, tool_calls, length, ..."""
    status = response.get("status")
    if status == "completed":
        output = response.get("output") or ()
        calls = any(item.get("type") in _TOOL_CALLS for item in output if isinstance(item, dict))
        return ["tool_calls" if calls else "stop"]
    if status == "incomplete":
        details = response.get("incomplete_details") or {}
        reason = details.get("reason") if isinstance(details, dict) else None
        return ["length" if reason in (None, "max_output_tokens") else str(reason)]
    return ["error" if status == "failed" else str(status)]


def end_attributes(
    turn: Turn, status: str, error: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """What the ended turn says, and its error.type (None: not failed); `error`: the
    failure's or refusal's code."""
    response = turn.response
    attributes: dict[str, Any] = {
        "gen_ai.response.id": str(response.get("id", "")),
        "gen_ai.response.model": str(response.get("model") or ""),
        "streamer.response.status": status,
    }
    if turn.replica:
        attributes["streamer.replica"] = turn.replica
    if status not in ("refused", "abandoned"):
        attributes["gen_ai.response.finish_reasons"] = finish_reasons(response)
    usage = response.get("usage")
    if isinstance(usage, dict):
        for key in ("input_tokens", "output_tokens"):
            if isinstance(usage.get(key), int):
                attributes[f"gen_ai.usage.{key}"] = usage[key]
    if status in ("failed", "refused"):
        return attributes, error or status
    if status == "abandoned":
        return attributes, "client_disconnected"
    return attributes, None


class TurnTrace:
    """The spans of one turn, current from `__init__` to `close` (same task)."""

    __slots__ = ("_compaction", "_span", "_tokens")

    def __init__(self, turn: Turn, transport: str) -> None:
        attributes = turn_attributes(turn, transport)
        name = f"{OPERATION} {attributes['gen_ai.request.model']}".rstrip()
        self._span = tracing.start(name, attributes, "server")
        self._tokens = [tracing.enter(self._span)]
        self._compaction: Span | None = None
        if turn.compactor is not None:  # the backend call under it makes the summary
            self._compaction = tracing.start(
                "compaction", {"streamer.compaction.input_items": len(turn.items)}
            )
            self._tokens.append(tracing.enter(self._compaction))

    def close(self, turn: Turn, status: str, error: str | None = None) -> None:
        for token in reversed(self._tokens):
            tracing.restore(token)
        self._tokens = []
        attributes, error = end_attributes(turn, status, error)
        if self._compaction is not None:
            summary = turn.compactor.summary() if turn.compactor is not None else ""
            tracing.end(self._compaction, {"streamer.compaction.summary_chars": len(summary)},
                        error)  # fmt: skip
        tracing.end(self._span, attributes, error)


def backend_attributes(model: str, url: str, request: Mapping[str, Any], api: str) -> dict:
    """A backend attempt: its model as sent, where (host and port, never credentials)."""
    parts = urlsplit(url)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": PROVIDERS.get(api, api),
        "gen_ai.request.model": str(request.get("model") or model),
        "server.address": parts.hostname or "",
        "streamer.model": model,
        **_copied(request, _BACKEND_FIELDS),
    }
    if parts.port is not None:
        attributes["server.port"] = parts.port
    return attributes


def replica_name(url: str) -> str:
    """A replica as logs and metrics name it: its URL without userinfo, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}".rstrip("/")
