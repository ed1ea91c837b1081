"""The API a backend speaks (`--upstream-api`), as data: how a turn's request is lowered
for it (a turn, a compaction turn) and what of that request estimates the prompt's usage.

`chat` lowers to Chat Completions (streamer/core/lowering.py); `responses` to a Responses
request (streamer/core/responses_lowering.py) with the backend's tool capabilities
(`BackendTools`, by --backend-profile). The pipeline holds one and never asks its name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from streamer.compaction import HANDOVER_PROMPT, compaction_request
from streamer.core.backend_tools import BackendTools
from streamer.core.lowering import LoweringOptions, lower
from streamer.core.responses_lowering import lower_responses
from streamer.core.tools import ResponsesToolNames

Lower = Callable[
    [Mapping[str, Any], list[dict[str, Any]], ResponsesToolNames, LoweringOptions], dict[str, Any]
]
log = logging.getLogger("streamer.backend_api")
APIS = ("chat", "responses")
# A compaction turn asks for a summary in plain text: no tools, no format.
_COMPACTION_DROPPED = ("tools", "tool_choice", "parallel_tool_calls", "text")


@dataclass(frozen=True, slots=True)
class BackendApi:
    name: str
    lower: Lower
    compaction: Lower
    prompt_keys: tuple[str, ...]  # the request's fields that are the prompt (usage estimates)


CHAT = BackendApi("chat", lower, compaction_request, ("messages", "tools"))


def _responses_compaction(
    tools: BackendTools,
    request: Mapping[str, Any],
    view: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
) -> dict[str, Any]:
    """The Responses request of a compaction turn: the history (the trigger aside), no
    tools, then the handover prompt as the last user message."""
    body = lower_responses(request, view[:-1], names, options, tools)
    for key in _COMPACTION_DROPPED:
        body.pop(key, None)
    body["input"].append({"type": "message", "role": "user", "content": HANDOVER_PROMPT})
    return body


def responses_api(tools: BackendTools) -> BackendApi:
    def lowered(
        request: Mapping[str, Any],
        items: list[dict[str, Any]],
        names: ResponsesToolNames,
        options: LoweringOptions,
    ) -> dict[str, Any]:
        body = lower_responses(request, items, names, options, tools)
        left_out = _left_out(request, body)
        if left_out:  # echoed to the client, but nobody runs them: the log says so
            log.info(
                "hosted tools left out (the backend does not run them, --backend-profile): %s",
                ", ".join(left_out),
            )
        return body

    return BackendApi(
        "responses",
        lowered,
        partial(_responses_compaction, tools),
        ("instructions", "input", "tools"),
    )


def _left_out(request: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """The hosted tool types of `request` that the backend request does not carry."""
    client = {"function", "custom", "namespace", "local_shell"}
    asked = {t.get("type") for t in request.get("tools") or () if isinstance(t, Mapping)}
    sent = {t.get("type") for t in body.get("tools") or ()}
    hosted = {t for t in asked if isinstance(t, str) and t not in client}
    return sorted(hosted - sent - {"tool_search"})


def backend_api(name: str, tools: BackendTools) -> BackendApi:
    """The `--upstream-api` named `name` (a ValueError for another)."""
    if name == "chat":
        return CHAT
    if name == "responses":
        return responses_api(tools)
    raise ValueError(f"unknown --upstream-api {name!r} (one of {', '.join(APIS)})")
