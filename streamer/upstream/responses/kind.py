"""The Responses kind's row (`--upstream-api responses`): lowered by
streamer/core/responses_lowering.py with the tool forms of its `--backend-profile` row
(profiles.py), sent by the shared client over this API's wire (client.py), read by
`ResponsesDecoder`. Its stream is Responses events: `tap` checks them as they are."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streamer.core.compaction import HANDOVER_PROMPT
from streamer.core.lowering import LoweringOptions
from streamer.core.responses_lowering import CLIENT_TOOL_TYPES, lower_responses
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.kind import BackendKind, Body
from streamer.upstream.responses.decoder import ResponsesDecoder, decode_response_body
from streamer.upstream.responses.profiles import backend_tools

log = logging.getLogger("streamer.upstream.responses")
# A compaction turn asks for a summary in plain text: no tools, no format.
_COMPACTION_DROPPED = ("tools", "tool_choice", "parallel_tool_calls", "text")
PATH = "/responses"


def streaming(backend_request: dict[str, Any]) -> dict[str, Any]:
    """The request as sent: streamed, stored nowhere but in the gateway (which keeps the
    state: stored responses, `previous_response_id`, background, compaction)."""
    body = dict(backend_request)
    body["stream"] = True
    body["store"] = False
    body.pop("stream_options", None)
    return body


def lower(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
    *,
    resume: Any = None,
    keep: bool = False,
) -> dict[str, Any]:
    """The backend's Responses request, with the tool forms `options.tools` says it takes
    (`resume`, `keep`: core/responses_lowering.py, as streamer/turns/history_reuse.py asks)."""
    body = lower_responses(request, items, names, options, options.tools, resume=resume, keep=keep)
    left_out = _left_out(request, body)
    if left_out:  # echoed to the client, but nobody runs them: the log says so
        log.info(
            "hosted tools left out (the backend does not run them, --backend-profile): %s",
            ", ".join(left_out),
        )
    return body


def compaction(
    request: Mapping[str, Any],
    view: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
) -> dict[str, Any]:
    """The Responses request of a compaction turn: the history (the trigger aside), no
    tools, then the handover prompt as the last user message."""
    body = lower_responses(request, view[:-1], names, options, options.tools)
    for key in _COMPACTION_DROPPED:
        body.pop(key, None)
    body["input"].append({"type": "message", "role": "user", "content": HANDOVER_PROMPT})
    return body


def _left_out(request: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """The hosted tool types of `request` that the backend request does not carry."""
    asked = {t.get("type") for t in request.get("tools") or () if isinstance(t, Mapping)}
    sent = {t.get("type") for t in body.get("tools") or ()}
    hosted = {t for t in asked if isinstance(t, str) and t not in CLIENT_TOOL_TYPES}
    return sorted(hosted - sent - {"tool_search"})


def _body(profile: BackendProfile) -> Body:
    return streaming


def _recorded(sent: Mapping[str, Any]) -> bool:
    return "input" in sent and "messages" not in sent


RESPONSES = BackendKind(
    name="responses",
    path=PATH,
    lower=lower,
    compaction=compaction,
    prompt_keys=("instructions", "input", "tools"),
    tools=backend_tools,
    body=_body,
    decoder=ResponsesDecoder,
    decode_whole=decode_response_body,
    recorded=_recorded,
    names_reasoning_parts=True,
    resuming=lower,
    resumes_stored=False,
)
