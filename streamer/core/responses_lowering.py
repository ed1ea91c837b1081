"""Lowering for `--upstream-api responses` (pure): a Responses request becomes the Responses
request a backend takes.

The gateway owns the state, so the backend gets the whole history as `input` (resolved as for
a Chat backend: stored responses, item references, sealed items opened) with `store: false`
and `stream: true` (upstream/responses/client.py sets those). Tools go as the backend's
`BackendTools` row says: namespace tools natively or flattened with the naming core, custom
tools natively or as a function of one string `input`, hosted tools passed to a backend that
runs them and left out otherwise (a `tool_choice` forcing one is then a 400). `tool_choice`
and the calls in `input` are rewritten the same way. Ids in `input` are the gateway's: they
are left out. Unknown fields and item types pass through.

Each item is lowered on its own, so a turn that continues an earlier one's lowering
(streamer/turns/history_reuse.py) lowers only its new items: `InputState` keeps the lowered items
and their bytes (core/wire_messages.py), and the input is a `LoweredMessages` whose earlier
part goes to the backend as those bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from streamer.core.backend_tools import BACKEND_BLOB, BackendTools
from streamer.core.call_kinds import CUSTOM, LOCAL_SHELL, MCP
from streamer.core.errors import invalid
from streamer.core.item_references import not_found
from streamer.core.lowering import LoweringOptions, nearest_effort
from streamer.core.tools import FlatTool, ResponsesToolNames
from streamer.core.wire_messages import Encoded, LoweredMessages

# What the gateway does itself (state, streaming, limits), never the backend.
GATEWAY_FIELDS = frozenset(
    {
        "input",
        "tools",
        "tool_choice",
        "previous_response_id",
        "conversation",
        "store",
        "stream",
        "stream_options",
        "background",
        "truncation",
        "max_tool_calls",
        "model",
        "include",
        "prompt",
    }
)
ENCRYPTED = "reasoning.encrypted_content"
CLIENT_TOOL_TYPES = ("function", "custom", "namespace", "local_shell")
"""Tool types the client runs (the rest are hosted: the backend runs them, or nobody)."""


@dataclass(frozen=True, slots=True)
class InputState:
    """The lowered input after `count` items: what a later turn with the same first items
    resumes from (its names: the map after them, kept beside it). Never changed."""

    count: int
    out: list[dict[str, Any]]  # the lowered items (an item the backend is not sent: none)
    encoded: Encoded  # the bytes of all of `out`


def lower_responses(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
    tools: BackendTools,
    *,
    resume: InputState | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """The backend's Responses request for `request`, whose effective input is `items`.
    `resume`: the state after `items[:resume.count]` (a turn before this one, with the
    same first items, tools and instructions; `names` the map as it left it): only the rest
    is lowered. `keep`: the state after all of `items` is kept on the input, a
    `LoweredMessages` (as it is whenever there is such a state)."""
    out: dict[str, Any] = {k: v for k, v in request.items() if k not in GATEWAY_FIELDS}
    model = options.model or request.get("model")
    if model:
        out["model"] = model
    out["input"] = _input(items, names, tools, resume, keep)
    out.update(_tools(request, names, tools))
    include = [
        v for v in request.get("include") or () if v != ENCRYPTED or tools.encrypted_reasoning
    ]
    if include:
        out["include"] = include
    reasoning = request.get("reasoning")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("effort"), str):
        effort = nearest_effort(reasoning["effort"], options.efforts)
        out["reasoning"] = {k: v for k, v in reasoning.items() if k != "effort"}
        if effort is not None:
            out["reasoning"]["effort"] = effort
    for key in options.drop:
        out.pop(key, None)
    return out


def _input(
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    tools: BackendTools,
    resume: InputState | None,
    keep: bool,
) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    if resume is None:
        _register_spellings(names)  # (a resumed map has them: its turn registered them)
        at, encoded = 0, Encoded()
    else:
        at, done, encoded = resume.count, resume.out, resume.encoded
    rest = [out for i in range(at, len(items)) if (out := _item(i, items[i], names, tools))]
    if resume is None and not keep:
        return rest
    if not keep:
        return LoweredMessages(done, 0, encoded, None, rest)
    whole = [*done, *rest] if done else rest
    state = InputState(len(items), whole, encoded.extend(whole))
    return LoweredMessages(whole, 0, state.encoded, state)


def _register_spellings(names: ResponsesToolNames) -> None:
    """Every namespaced tool may come back as `ns.name` (Ollama's join, or a backend that
    split the name into `namespace` and `name`): one more exact spelling in the map."""
    for tool in names.tools:
        ident = tool.identity
        if ident.namespace is not None:
            names.alias(f"{ident.namespace}.{ident.name}", tool.name)


# -- input --------------------------------------------------------------------------------


def _item(
    index: int, item: dict[str, Any], names: ResponsesToolNames, tools: BackendTools
) -> dict[str, Any] | None:
    kind = item.get("type", "message" if "role" in item else "item_reference")
    if kind == "item_reference":  # the gateway puts the items in; this one is unknown
        raise not_found(str(item.get("id")), index)
    out = {k: v for k, v in item.items() if k != "id"}
    if kind == "function_call":
        return _call(out, names, tools, "function")
    if kind == "custom_tool_call":
        if tools.custom:
            return _call(out, names, tools, "custom")
        return _function_call(out, *CUSTOM.as_function(names, index, item))
    if kind == "local_shell_call":  # a function to every backend (tool_decls)
        return _function_call(out, *LOCAL_SHELL.as_function(names, index, item))
    if kind == "custom_tool_call_output" and not tools.custom:
        return _output(out)
    if kind == "mcp_call" and "call_id" in item:  # an MCP call the gateway ran (mcp_history)
        return _function_call(out, *MCP.as_function(names, index, item))
    if kind in ("local_shell_call_output", "mcp_call_output"):
        return _output(out)
    if kind == "reasoning":
        return _reasoning(out, tools)
    return out


def _call(
    item: dict[str, Any], names: ResponsesToolNames, tools: BackendTools, kind: Any
) -> dict[str, Any]:
    ns = item.get("namespace") or None
    if ns is not None and tools.namespaces:
        return item  # the backend routes by (namespace, name) itself
    item.pop("namespace", None)
    item["name"] = names.encode(ns, item["name"], kind)
    if kind == "function":
        item["arguments"] = _whole_arguments(item.get("arguments"))
    return item


def _whole_arguments(arguments: Any) -> str:
    """Arguments a backend can parse again: a call cut off mid-arguments (llama.cpp ends
    such a turn `completed`) and an empty one are replayed as `{}`."""
    if not isinstance(arguments, str) or not arguments.strip():
        return "{}"
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return "{}"
    return arguments


def _function_call(item: dict[str, Any], flat: str, arguments: str) -> dict[str, Any]:
    out = {"type": "function_call", "call_id": item.get("call_id"), "name": flat}
    out["arguments"] = arguments
    if item.get("status"):
        out["status"] = item["status"]
    return out


def _output(item: dict[str, Any]) -> dict[str, Any]:
    output = item.get("output")
    if not isinstance(output, str | list):
        output = _json(output, "input")
    return {"type": "function_call_output", "call_id": item.get("call_id"), "output": output}


def _reasoning(item: dict[str, Any], tools: BackendTools) -> dict[str, Any] | None:
    """Reasoning as the backend takes it back: its own blob (the gateway's seal opened), or
    readable text for a backend that reads it; else nothing."""
    item.pop("encrypted_content", None)  # the gateway's seal (opened into `content`)
    backend = item.pop(BACKEND_BLOB, None)
    if tools.encrypted_reasoning:  # it reads back only its own blob
        if not isinstance(backend, str):
            return None
        return {"type": "reasoning", "summary": [], "encrypted_content": backend}
    if not tools.reasoning_input or not item.get("content"):
        return None
    item.setdefault("summary", [])
    return item


# -- tools --------------------------------------------------------------------------------


def _tools(
    request: Mapping[str, Any], names: ResponsesToolNames, tools: BackendTools
) -> dict[str, Any]:
    raw_tools = [t for t in request.get("tools") or () if isinstance(t, Mapping)]
    hosted = [t for t in raw_tools if t.get("type") not in CLIENT_TOOL_TYPES]
    kept_hosted = [dict(t) for t in hosted if _runs(t, tools)]
    choice_value = request.get("tool_choice")
    forced = dict(choice_value) if isinstance(choice_value, Mapping) else {}
    forced_hosted = _hosted_choice(forced, tools)
    if forced_hosted and not any(t.get("type") == forced["type"] for t in kept_hosted):
        raise invalid(
            f"tool_choice forces the hosted tool {forced['type']!r}, which this "
            "backend does not run (--backend-profile).",
            "tool_choice.type",
            "unsupported_tool",
        )
    # a hosted tool the backend runs is forced as sent; the naming core knows client tools only
    choice = names.resolve_choice(None if forced_hosted else choice_value)
    flat_tools = names.tools
    if choice.allowed is not None:  # the narrowed list: the form every backend takes
        allowed = set(choice.allowed)
        flat_tools = [t for t in flat_tools if t.name in allowed]
    declared = _declared(flat_tools, raw_tools, tools)
    if not declared and not kept_hosted:
        return {}
    out: dict[str, Any] = {"tools": declared + kept_hosted}
    out["tool_choice"] = forced if forced_hosted else choice.mode
    if isinstance(request.get("parallel_tool_calls"), bool):
        out["parallel_tool_calls"] = request["parallel_tool_calls"]
    return out


def _runs(tool: Mapping[str, Any], tools: BackendTools) -> bool:
    kind = tool.get("type")
    if kind == "tool_search" and tool.get("execution") == "client":
        return False  # a client tool: a function like the others
    return kind in tools.hosted


def _hosted_choice(choice: Mapping[str, Any], tools: BackendTools) -> bool:
    kind = choice.get("type")
    if kind == "mcp" and "mcp" not in tools.hosted:
        return False  # the gateway runs the MCP servers: their tools are its functions
    return isinstance(kind, str) and kind not in (
        *CLIENT_TOOL_TYPES,
        "allowed_tools",
        "tool_search",
    )


def _declared(
    flat_tools: list[FlatTool], raw_tools: list[Mapping[str, Any]], tools: BackendTools
) -> list[dict[str, Any]]:
    """The client tools as the backend takes them, in request order."""
    raw = _raw_index(raw_tools)
    out: list[dict[str, Any]] = []
    spaces: dict[str, dict[str, Any]] = {}
    for tool in flat_tools:
        ident = tool.identity
        native_ns = ident.namespace is not None and tools.namespaces
        source = raw.get((ident.namespace, ident.name))
        name = ident.name if native_ns else tool.name
        if ident.kind == "custom" and tools.custom and source is not None:
            decl = {k: v for k, v in source.items() if k not in ("name",)}
            decl["name"] = name
        else:
            decl = _function(tool, name)
        if not native_ns:
            out.append(decl)
            continue
        assert ident.namespace is not None
        space = spaces.get(ident.namespace)
        if space is None:
            space = spaces[ident.namespace] = _namespace(ident.namespace, raw)
            out.append(space)
        space["tools"].append(decl)
    return out


def _raw_index(raw_tools: list[Mapping[str, Any]]) -> dict[tuple[str | None, str], Any]:
    """The client's own declarations by (namespace, name); namespaces under (name, "")."""
    index: dict[tuple[str | None, str], Any] = {}
    for tool in raw_tools:
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            index[(tool["name"], "")] = tool
            for member in tool.get("tools") or ():
                if isinstance(member, Mapping) and isinstance(member.get("name"), str):
                    index.setdefault((tool["name"], member["name"]), member)
        elif isinstance(tool.get("name"), str):
            index.setdefault((None, tool["name"]), tool)
    return index


def _namespace(ns: str, raw: dict[tuple[str | None, str], Any]) -> dict[str, Any]:
    space: dict[str, Any] = {"type": "namespace", "name": ns}
    description = (raw.get((ns, "")) or {}).get("description")
    if isinstance(description, str):
        space["description"] = description
    space["tools"] = []
    return space


def _function(tool: FlatTool, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "name": name}
    if tool.description is not None:
        out["description"] = tool.description
    out["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object"}
    if tool.strict is not None:
        out["strict"] = tool.strict
    return out


def _json(value: Any, param: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        raise invalid(f"Invalid value for '{param}': {exc}.", param) from None
