"""MCP items in a turn's history: what they tell the gateway, and what the backend sees (pure).

- `listed`: the tools each server listed, from its `mcp_list_tools` item: a continued turn
  (`previous_response_id`, or the items replayed) does not list them again;
- `approvals`: the new input's `mcp_approval_response` items, each with the
  `mcp_approval_request` it answers (400 for one that answers nothing); an approved call the
  history has already run is not run again;
- `replayed`: the items as every backend kind is shown them: an `mcp_call` is the tool call
  and its result (`mcp_call` with a `call_id`, then `mcp_call_output`: the call-kinds rows,
  core/call_kinds.py), a declined approval request the call and "declined", the list, the
  requests and responses nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamer.core.errors import invalid
from streamer.core.mcp_items import ListedTool, declined_text, listed_tool, model_text

MCP_ITEM_TYPES = frozenset(
    {"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"}
)


@dataclass(frozen=True, slots=True)
class Approval:
    """A new `mcp_approval_response` and the request it answers."""

    request: Mapping[str, Any]  # the mcp_approval_request item
    approve: bool
    reason: str | None = None


def has_mcp(items: Sequence[Any]) -> bool:
    """Whether any item is an MCP item (a pass over the types only)."""
    return any(isinstance(i, Mapping) and i.get("type") in MCP_ITEM_TYPES for i in items)


def listed(items: Sequence[Mapping[str, Any]]) -> dict[str, list[ListedTool]]:
    """Each server label's tools as its last successful `mcp_list_tools` item lists them."""
    out: dict[str, list[ListedTool]] = {}
    for item in items:
        if item.get("type") != "mcp_list_tools" or item.get("error"):
            continue
        label, tools = item.get("server_label"), item.get("tools")
        if isinstance(label, str) and isinstance(tools, list):
            found = (listed_tool(t) for t in tools if isinstance(t, Mapping))
            out[label] = [t for t in found if t is not None]
    return out


def approvals(items: Sequence[Mapping[str, Any]], new_from: int) -> list[Approval]:
    """The approval responses among `items[new_from:]` with their requests (from anywhere
    in `items`), in order; a response to a call already run (its `mcp_call` carries the
    request's id) or answered before is left out."""
    requests: dict[str, Mapping[str, Any]] = {}
    done: set[str] = set()
    out: list[Approval] = []
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "mcp_approval_request" and isinstance(item.get("id"), str):
            requests[item["id"]] = item
        elif kind == "mcp_call" and isinstance(item.get("approval_request_id"), str):
            done.add(item["approval_request_id"])
        elif kind == "mcp_approval_response":
            answer = _response(item, i, requests, i >= new_from)
            if answer is None or answer.request["id"] in done:
                continue
            done.add(answer.request["id"])
            if i >= new_from:
                out.append(answer)
    return out


def _response(
    item: Mapping[str, Any], i: int, requests: Mapping[str, Mapping[str, Any]], new: bool
) -> Approval | None:
    """One response checked (a new one strictly: 400s) with the request it answers."""
    p = f"input[{i}]"
    request_id, approve = item.get("approval_request_id"), item.get("approve")
    if not isinstance(request_id, str) or not request_id:
        if not new:
            return None
        raise invalid(
            f"Missing required parameter: '{p}.approval_request_id'.", f"{p}.approval_request_id"
        )
    if not isinstance(approve, bool):
        if not new:
            return None
        raise invalid(f"Invalid type for '{p}.approve': expected a boolean.", f"{p}.approve")
    request = requests.get(request_id)
    if request is None:
        if not new:
            return None
        raise invalid(
            f"No mcp_approval_request with id '{request_id}' in this conversation.",
            f"{p}.approval_request_id",
        )
    reason = item.get("reason")
    return Approval(request, approve, reason if isinstance(reason, str) else None)


def replayed(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` as a backend is shown them: MCP items become calls and results, or nothing."""
    declined = _declined(items)
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind not in MCP_ITEM_TYPES:
            out.append(item)
        elif kind == "mcp_call":
            out.extend(_pair(item, i, model_text(_str(item.get("output")), _error(item))))
        elif kind == "mcp_approval_response" and i in declined:
            request, reason = declined[i]
            out.extend(_pair(request, i, declined_text(reason)))
    return out


def _declined(items: Sequence[Mapping[str, Any]]) -> dict[int, tuple[Mapping[str, Any], Any]]:
    """The declining responses, by position: the request each declines, and its reason."""
    requests = {
        item.get("id"): item for item in items if item.get("type") == "mcp_approval_request"
    }
    out: dict[int, tuple[Mapping[str, Any], Any]] = {}
    for i, item in enumerate(items):
        if item.get("type") == "mcp_approval_response" and item.get("approve") is False:
            request = requests.get(item.get("approval_request_id"))
            if request is not None:
                out[i] = (request, item.get("reason"))
    return out


def _pair(item: Mapping[str, Any], i: int, result: str) -> list[dict[str, Any]]:
    """The call (the mcp_call row's history form) and its result, under one call id."""
    label, name = item.get("server_label"), item.get("name")
    if not isinstance(label, str) or not isinstance(name, str) or not name:
        raise invalid(
            f"An {item.get('type')} needs string 'server_label' and 'name'.", f"input[{i}]"
        )
    call_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else f"mcp_{i}"
    arguments = item.get("arguments")
    call = {
        "type": "mcp_call",
        "call_id": call_id,
        "server_label": label,
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else "{}",
    }
    return [call, {"type": "mcp_call_output", "call_id": call_id, "output": result}]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """An mcp_call's error as the typed shape (an older string error becomes a message)."""
    error = item.get("error")
    if error is None or error == "":
        return None
    if isinstance(error, Mapping):
        return dict(error)
    return {"type": "mcp_protocol_error", "code": 0, "message": str(error)}
