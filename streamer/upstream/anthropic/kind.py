"""The Anthropic Messages kind's row (`--upstream-api anthropic`, a model's `api =
"anthropic"`): lowered by request.py (profiles.py's row for the model's `--backend-profile`),
`POST {base}/messages` always streamed with the key in `x-api-key` and `anthropic-version`,
read by `MessagesDecoder` (a whole JSON Message by `decode_message_body`), its errors by
errors.py; `tap` reads its events with `MessagesTapDecoder`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.core.backend_tools import FLAT
from streamer.upstream.anthropic.errors import http_error
from streamer.upstream.anthropic.profiles import VERSION
from streamer.upstream.anthropic.request import PROMPT_KEYS, compaction_request, lower_messages
from streamer.upstream.anthropic.stream import (
    MessagesDecoder,
    MessagesTapDecoder,
    decode_message_body,
    looks_like_messages,
)
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.chat.rejected_params import rejected_params
from streamer.upstream.kind import STREAM_HEADERS, BackendKind, Body, TapReading

PATH = "/messages"
_REQUIRED = frozenset({"max_tokens", "max_completion_tokens"})  # the API needs `max_tokens`
_BLOCKS = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"}
)


def streaming(backend_request: dict[str, Any]) -> dict[str, Any]:
    body = dict(backend_request)
    body["stream"] = True
    return body


def _body(profile: BackendProfile) -> Body:
    return streaming


def _key(api_key: str) -> tuple[str, str]:
    return "x-api-key", api_key


def _rejected(status: int, raw: bytes, sent: Mapping[str, Any]) -> tuple[str, ...]:
    """The optional parameters a 400 names, `max_tokens` never (the API requires it)."""
    return tuple(n for n in rejected_params(status, raw, sent) if n not in _REQUIRED)


def _recorded(sent: Mapping[str, Any]) -> bool:
    """A request lowered for this kind: `max_tokens`, and messages of content blocks only
    (the Chat lowering sends text as strings, images as `image_url` parts)."""
    messages = sent.get("messages")
    if "max_tokens" not in sent or not isinstance(messages, list) or not messages:
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list) or message.get("role") not in ("user", "assistant"):
            return False
        if not all(isinstance(b, Mapping) and b.get("type") in _BLOCKS for b in content):
            return False
    return True


ANTHROPIC = BackendKind(
    name="anthropic",
    path=PATH,
    lower=lower_messages,
    compaction=compaction_request,
    prompt_keys=PROMPT_KEYS,
    tools=lambda profile: FLAT,  # Messages tools are functions: namespaces flattened
    body=_body,
    decoder=MessagesDecoder,
    decode_whole=decode_message_body,
    recorded=_recorded,
    tap=TapReading("anthropic-sse", looks_like_messages, MessagesTapDecoder),
    headers=(*STREAM_HEADERS, ("anthropic-version", VERSION)),
    auth=_key,
    http_error=http_error,
    rejected_params=_rejected,
)
