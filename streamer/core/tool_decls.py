"""Declaration walking: validate a request's callable tools into plain declarations (pure).

Tools come from the request's `tools` and from `additional_tools` and `tool_search_output`
input items. Every malformed entry is a 400 `RequestError` naming its param path. This
module knows nothing about flat names; `streamer.tools` turns the declarations into them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import orjson

from streamer.core.client_tools import CLIENT_TOOLS, runs_on_client
from streamer.core.errors import invalid
from streamer.core.tool_templates import SOURCE_ITEMS as _SOURCE_ITEMS

ToolKind = Literal[
    "function", "custom", "tool_search", "local_shell", "shell", "apply_patch", "mcp"
]
# Tools named by their type, one of each.
FIXED_NAME_KINDS = ("tool_search", "local_shell", "shell", "apply_patch")

# `local_shell` (older Codex, the Agents SDK) as a function: its arguments are the action
# of the `local_shell_call` it comes back as (OpenAI's `LocalShellCallAction`, type exec).
LOCAL_SHELL_DESCRIPTION = (
    "Run a command on the user's machine and get its output. `command` is the program and"
    ' its arguments, one string each (e.g. ["bash", "-lc", "ls -la"]).'
)
LOCAL_SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "working_directory": {"type": "string"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "timeout_ms": {"type": "integer"},
        "user": {"type": "string"},
    },
    "required": ["command"],
    "additionalProperties": False,
}

_OBJECT = (dict, Mapping)  # dict first: an exact check, far cheaper than the ABC's

_Key = tuple[str | None, str, str]  # (namespace, name, kind): a declaration's identity
_LocalKey = tuple[str | None, str, bool]  # function and custom share one name space


class Decl(NamedTuple):
    """One callable tool as declared, before it gets a flat name."""

    namespace: str | None
    name: str
    kind: ToolKind
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


def declarations(
    tools: Sequence[Mapping[str, Any]] | None,
    input_items: Iterable[Any],
    *,
    max_tools: int,
    max_tool_bytes: int,
) -> list[Decl]:
    """Every distinct callable tool of one request, in request order (400 `RequestError`s)."""
    sources = _sources(tools, input_items)
    _check_budget(sources, max_tools, max_tool_bytes)
    out: list[Decl] = []
    seen: set[_Key] = set()
    for lst, base in sources:
        _collect(lst, base, out, seen)
    return out


def _sources(tools: Any, input_items: Any) -> list[tuple[Sequence[Any], str]]:
    """Every tools list of the request with its param path, in request order."""
    out: list[tuple[Sequence[Any], str]] = []
    if tools is not None:
        if not isinstance(tools, list | tuple):
            raise invalid("'tools' must be an array.", "tools")
        out.append((tools, "tools"))
    if input_items is None or isinstance(input_items, str | bytes | Mapping):
        return out  # a string `input` carries no tools
    for i, item in enumerate(input_items):
        if isinstance(item, _OBJECT) and item.get("type") in _SOURCE_ITEMS:
            lst = item.get("tools")
            if lst is None:
                continue
            if not isinstance(lst, list | tuple):
                raise invalid(f"'{item['type']}' tools must be an array.", f"input[{i}].tools")
            out.append((lst, f"input[{i}].tools"))
    return out


def _check_budget(
    sources: list[tuple[Sequence[Any], str]], max_tools: int, max_tool_bytes: int
) -> None:
    """Rule 8: refuse oversized tool sets before doing work proportional to them."""
    n = 0
    for lst, base in sources:
        for tool in lst:
            is_ns = isinstance(tool, _OBJECT) and tool.get("type") == "namespace"
            members = tool.get("tools") if is_ns else None
            # Every entry counts at least once, so this loop stops after max_tools + 1 steps.
            n += max(1, len(members)) if isinstance(members, list) else 1
            if n > max_tools:
                raise invalid(
                    f"Too many tools: more than {max_tools} callable tools in one request.",
                    base,
                    code="array_above_max_length",
                )
    size = 0
    for lst, base in sources:
        try:
            size += len(orjson.dumps(lst))
        except TypeError:  # integers beyond 64 bits from a stdlib JSON parser
            size += len(json.dumps(lst, default=str))
        if size > max_tool_bytes:
            raise invalid(
                f"Tool definitions are too large: more than {max_tool_bytes} bytes.", base
            )


def _collect(lst: Sequence[Any], base: str, out: list[Decl], seen: set[_Key]) -> None:
    """Validate one tools list and append its new callable declarations to `out`."""
    local: set[_LocalKey] = set()
    for i, tool in enumerate(lst):
        p = f"{base}[{i}]"
        if not isinstance(tool, _OBJECT):
            raise invalid("A tool must be an object.", p)
        kind = tool.get("type")
        if kind in ("function", "custom"):
            _member(tool, _own_namespace(tool), None, p, local, out, seen)
        elif kind == "namespace":
            _namespace(tool, p, local, out, seen)
        elif kind == "tool_search":
            if tool.get("execution") == "client":  # server or missing: hosted, not ours
                _add(None, "tool_search", "tool_search", tool, None, p, local, out, seen)
        elif kind == "local_shell":  # executed by the client: a function to the backend
            _add(None, "local_shell", "local_shell", tool, None, p, local, out, seen)
        elif isinstance(kind, str) and kind in CLIENT_TOOLS:  # the client's unless hosted
            if runs_on_client(tool, p):
                _add(None, kind, CLIENT_TOOLS[kind].kind, tool, None, p, local, out, seen)
        elif not isinstance(kind, str):
            raise invalid("A tool needs a string 'type'.", f"{p}.type")
        # `mcp`: a server the gateway lists; its tools are declared once listed
        # (`ResponsesToolNames.declare`). Any other type is a hosted tool: run by a backend
        # that takes it, else refused or left out (core/hosted_tools.py).


def _own_namespace(tool: Mapping[str, Any]) -> str | None:
    """A deferred top-level function's own name, else None (a top-level tool has no namespace).

    OpenAI calls a deferred top-level function (one loaded by tool search) with `namespace`
    equal to its name, and the Agents SDK routes such a call only in that form.
    """
    name = tool.get("name")
    deferred = tool.get("type") == "function" and tool.get("defer_loading") is True
    return name if deferred and isinstance(name, str) and name else None


def _namespace(
    tool: Mapping[str, Any], p: str, local: set[_LocalKey], out: list[Decl], seen: set[_Key]
) -> None:
    ns = tool.get("name")
    if not isinstance(ns, str) or not ns:
        raise invalid("A namespace tool needs a non-empty 'name'.", f"{p}.name")
    members = tool.get("tools")
    if not isinstance(members, list) or not members:
        raise invalid(f"Namespace {ns!r} needs a non-empty 'tools' array.", f"{p}.tools")
    preface = _namespace_preface(ns, tool.get("description"))
    for j, m in enumerate(members):
        mp = f"{p}.tools[{j}]"
        if not isinstance(m, _OBJECT):
            raise invalid("A namespace member must be an object.", mp)
        mkind = m.get("type")
        if mkind == "namespace":
            raise invalid(f"Namespace {ns!r} contains a nested namespace.", f"{mp}.type")
        if mkind not in ("function", "custom"):
            raise invalid(
                f"Namespace {ns!r} may contain only function and custom tools, not {mkind!r}.",
                f"{mp}.type",
            )
        _member(m, ns, preface, mp, local, out, seen)


def _namespace_preface(ns: str, description: Any) -> str | None:
    """The namespace's description when it tells the model something, else None.

    The backend has no namespaces, so this is the only way the model sees it. Codex's
    boilerplate adds nothing the flat name does not already say. A non-string description
    is ignored rather than refused: the model can do without it.
    """
    if not isinstance(description, str):
        return None
    text = description.strip()
    if not text or text == f"Tools in the {ns} namespace.":
        return None
    return text


def _member(
    tool: Mapping[str, Any],
    ns: str | None,
    preface: str | None,
    p: str,
    local: set[_LocalKey],
    out: list[Decl],
    seen: set[_Key],
) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"A {tool['type']} tool needs a non-empty 'name'.", f"{p}.name")
    _add(ns, name, tool["type"], tool, preface, p, local, out, seen)


def _add(
    ns: str | None,
    name: str,
    kind: ToolKind,
    tool: Mapping[str, Any],
    preface: str | None,
    p: str,
    local: set[_LocalKey],
    out: list[Decl],
    seen: set[_Key],
) -> None:
    # Function and custom share a name space; only a duplicate within one list is an error.
    fixed = kind in FIXED_NAME_KINDS
    key = (ns, name, fixed)
    if key in local:
        where = f" in namespace {ns!r}" if ns else ""
        raise invalid(f"Duplicate tool {name!r}{where}.", p if fixed else f"{p}.name")
    local.add(key)
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("A tool description must be a string.", f"{p}.description")
    if kind == "custom":
        params: dict[str, Any] | None = {  # a fresh dict per tool: callers may mutate it
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
            "additionalProperties": False,
        }
        description = _custom_description(description, tool.get("format"), p)
        strict = None
    elif kind == "local_shell":
        params, description, strict = dict(LOCAL_SHELL_PARAMETERS), LOCAL_SHELL_DESCRIPTION, None
    elif kind in CLIENT_TOOLS:
        (params, description), strict = CLIENT_TOOLS[kind].declaration(), None
    else:
        raw = tool.get("parameters")
        if raw is not None and not isinstance(raw, _OBJECT):
            raise invalid("Tool parameters must be a JSON Schema object.", f"{p}.parameters")
        params = raw if raw is None or isinstance(raw, dict) else dict(raw)
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid("A tool's 'strict' must be a boolean.", f"{p}.strict")
    before = len(seen)
    seen.add((ns, name, kind))
    if len(seen) == before:  # declared by an earlier source (tools, then input items)
        return
    if preface is not None:
        description = f"{preface}\n\n{description}" if description else preface
    out.append(Decl(ns, name, kind, description, params, strict))


def _custom_description(description: str | None, fmt: Any, p: str) -> str | None:
    """The custom tool's description plus its input format, so the model can follow it."""
    if fmt is None:
        return description
    if not isinstance(fmt, Mapping):
        raise invalid("A custom tool's 'format' must be an object.", f"{p}.format")
    kind = fmt.get("type")
    if kind is None:  # as OpenAI: the format says what it is (its echo needs it too)
        raise invalid(
            "A custom tool's 'format' needs a 'type' (text or grammar).", f"{p}.format.type"
        )
    if kind == "text":
        return description
    if kind == "grammar":
        definition = fmt.get("definition")
        if not isinstance(definition, str):
            raise invalid("A grammar format needs a string 'definition'.", f"{p}.format.definition")
        syntax = fmt.get("syntax")
        note = f"The `input` string must match this {syntax} grammar:\n{definition}"
    else:
        note = f"The `input` string must follow this format: {json.dumps(fmt, default=str)}"
    return f"{description}\n\n{note}" if description else note
