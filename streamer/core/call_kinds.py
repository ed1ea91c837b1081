"""The output item kinds of tool calls, one row each: all the gateway does with one (pure).

A backend calls a function; the function's flat name decodes (the tool map) to an identity
whose `kind` picks the row. The row says what the call becomes for the client and back:

- `call_type`, `output_type`: the call item and the input item that answers it, and the id
  prefixes of both (`id_prefix`, `output_prefix`; the store names unnamed input items so);
- lifting, the backend's call made the client's item: `added` (the item's fields when
  `output_item.added` goes out), then `lifted` (its `field` from the whole arguments; None:
  the item was added whole, a shell or apply_patch call), `events` (the `*.delta` and
  `*.done` event types its arguments stream as; None: none), `statuses` (its status enum);
- lowering, a history item made a function call again for a backend that takes only
  functions (Chat Completions; a Responses backend for the kinds it has no native form of):
  `flat` (the function's name), `lowered` (its arguments: a string as it is, else JSON).

`shell` and `apply_patch` take their fields from their `ClientTool` rows (client_tools.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from streamer.core.client_tools import CLIENT_TOOLS, ClientTool
from streamer.core.errors import invalid
from streamer.core.json_bounds import MAX_ITEM_DEPTH, loads_within
from streamer.core.tools import ResponsesToolNames, ToolIdentity

_CALL_STATUSES = ("in_progress", "completed", "incomplete")
ARGUMENTS_DELTA = "response.function_call_arguments.delta"  # the live call's (output.py)


@dataclass(frozen=True, slots=True)
class CallKind:
    kind: str  # the identity's kind (`ToolIdentity.kind`)
    call_type: str
    output_type: str
    id_prefix: str
    output_prefix: str
    field: str  # the call item's field the arguments become
    added: Callable[[ToolIdentity, str, Sequence[str]], dict[str, Any]]  # (identity, call id, args)
    lifted: Callable[[str], Any] | None  # whole arguments -> `field`; None: added whole
    flat: Callable[[ResponsesToolNames, Mapping[str, Any]], str]  # a history item's function
    lowered: Callable[[Mapping[str, Any]], Any]  # ... and its arguments (str: as they are)
    events: tuple[str, str] | None = None  # (delta, done) event types of its arguments
    done_named: bool = False  # its done event names the tool (function_call_arguments.done)
    statuses: tuple[str, ...] = _CALL_STATUSES
    hosted: bool = False  # run by the gateway (an MCP call): a Responses backend's own such
    # item (it ran the tool itself) passes whole; the client never answers it

    @property
    def named(self) -> bool:
        """The item names its tool (`name`, `namespace`); else the tool is its type's."""
        return self.events is not None

    def status(self, status: str) -> str:
        """The item's status in this type's enum (apply_patch_call has no `incomplete`)."""
        return status if status in self.statuses else "in_progress"

    def as_function(
        self, names: ResponsesToolNames, index: int, item: Mapping[str, Any]
    ) -> tuple[str, str]:
        """History item `index` as a function call: its flat name and arguments."""
        value = self.lowered(item)
        if isinstance(value, str):
            return self.flat(names, item), value
        try:
            arguments = orjson.dumps(value).decode()
        except orjson.JSONEncodeError as exc:  # >64-bit integers, lone surrogates
            param = f"input[{index}].{self.field}"
            raise invalid(f"Invalid value for '{param}': {exc}.", param) from None
        return self.flat(names, item), arguments


# -- lifting ------------------------------------------------------------------------------


def public_name(identity: ToolIdentity) -> dict[str, str]:
    """`name`, plus `namespace` for namespaced identities: what Codex routes on."""
    if identity.namespace is None:
        return {"name": identity.name}
    return {"name": identity.name, "namespace": identity.namespace}


def custom_input(arguments: str) -> str:
    """A custom tool's raw input from its function wrapper's `{"input": ...}` arguments.

    Models sometimes answer the wrapper with the raw text instead of JSON; keep it.
    """
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return _cut_input(arguments)
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


_CUT_INPUT = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_LONGEST_ESCAPE = 6  # `\uXXXX`: what a cut may leave of an escape


def _cut_input(arguments: str) -> str:
    """The input string so far of a wrapper cut off inside it (`{"input": "abc`), else the
    raw text (a model that answered the wrapper with the raw input)."""
    start = _CUT_INPUT.match(arguments)
    if start is None:
        return arguments
    body = arguments[start.end() :]
    for cut in range(_LONGEST_ESCAPE + 1):
        head = body[: len(body) - cut]
        for end in ('"', ""):
            try:
                value = orjson.loads('"' + head + end)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, str):
                return value
    return arguments


def local_shell_action(arguments: str) -> dict[str, Any]:
    """A `local_shell_call`'s action (OpenAI's `LocalShellCallAction`) from the arguments the
    backend gave its function: `command` as a list of strings (a model that sent one string
    gets it run by `bash -lc`), `env` always an object, the optional fields when well typed."""
    args = json_object(arguments)
    command = args.get("command")
    if isinstance(command, str):
        command = ["bash", "-lc", command]
    elif isinstance(command, list):
        command = [
            part if isinstance(part, str) else orjson.dumps(part).decode() for part in command
        ]
    else:
        command = []
    env = args.get("env")
    env = (
        {str(k): v if isinstance(v, str) else str(v) for k, v in env.items()}
        if isinstance(env, dict)
        else {}
    )
    action: dict[str, Any] = {"type": "exec", "command": command, "env": env}
    for key, kind in (("working_directory", str), ("timeout_ms", int), ("user", str)):
        value = args.get(key)
        if isinstance(value, kind) and not isinstance(value, bool):
            action[key] = value
    return action


def json_object(arguments: str) -> Any:
    """Tool-search arguments travel as a JSON object, not a string (nested deeper than an
    item may be, they are not JSON: `json_bounds.loads_within`)."""
    try:
        value = loads_within(arguments or "{}", MAX_ITEM_DEPTH - 1)
    except orjson.JSONDecodeError:
        return {"query": arguments}
    return value if isinstance(value, dict) else {"query": value}


# -- lowering -----------------------------------------------------------------------------


def _by_name(kind: str) -> Callable[[ResponsesToolNames, Mapping[str, Any]], str]:
    def flat(names: ResponsesToolNames, item: Mapping[str, Any]) -> str:
        return names.encode(item.get("namespace") or None, item["name"], kind)  # type: ignore[arg-type]

    return flat


def _by_type(kind: str) -> Callable[[ResponsesToolNames, Mapping[str, Any]], str]:
    def flat(names: ResponsesToolNames, item: Mapping[str, Any]) -> str:
        return names.encode(None, kind, kind)  # type: ignore[arg-type]

    return flat


def search_name(names: ResponsesToolNames, item: Mapping[str, Any] | None = None) -> str:
    """The flat name of the request's `tool_search` tool (declared, or the default one)."""
    for tool in names.tools:
        if tool.identity.kind == "tool_search":
            return tool.name
    return names.encode(None, "tool_search", "tool_search")


def _search_arguments(item: Mapping[str, Any]) -> Any:
    raw = item.get("arguments")
    return raw if isinstance(raw, str) else raw or {}


def _shell_action(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item["action"].items() if k != "type" and v is not None}


# -- the rows -----------------------------------------------------------------------------


def _client_row(tool: ClientTool) -> CallKind:
    """A shell or apply_patch call: added whole (it never streams live)."""
    return CallKind(
        kind=tool.kind,
        call_type=tool.call_type,
        output_type=tool.output_type,
        id_prefix=tool.id_prefix,
        output_prefix=tool.id_prefix + "o",
        field=tool.field,
        added=lambda identity, call_id, args: {
            "call_id": call_id,
            **tool.call_fields("".join(args)),
        },
        lifted=None,
        flat=_by_type(tool.kind),
        lowered=tool.replay_arguments,
        statuses=tool.statuses,
    )


FUNCTION = CallKind(
    kind="function",
    call_type="function_call",
    output_type="function_call_output",
    id_prefix="fc",
    output_prefix="fco",
    field="arguments",
    added=lambda identity, call_id, args: {
        "arguments": "",
        "call_id": call_id,
        **public_name(identity),
    },
    lifted=str,
    flat=_by_name("function"),
    lowered=lambda item: item.get("arguments") or "",
    events=(ARGUMENTS_DELTA, "response.function_call_arguments.done"),
    done_named=True,
)
CUSTOM = CallKind(
    kind="custom",
    call_type="custom_tool_call",
    output_type="custom_tool_call_output",
    id_prefix="ctc",
    output_prefix="ctco",
    field="input",
    added=lambda identity, call_id, args: {
        "call_id": call_id,
        "input": "",
        **public_name(identity),
    },
    lifted=custom_input,
    flat=_by_name("custom"),
    lowered=lambda item: {"input": item.get("input") or ""},
    events=("response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"),
)
TOOL_SEARCH = CallKind(
    kind="tool_search",
    call_type="tool_search_call",
    output_type="tool_search_output",
    id_prefix="tsc",
    output_prefix="tso",
    field="arguments",
    added=lambda identity, call_id, args: {
        "call_id": call_id,
        "execution": "client",
        "arguments": {},
    },
    lifted=json_object,
    flat=search_name,
    lowered=_search_arguments,
)
LOCAL_SHELL = CallKind(
    kind="local_shell",
    call_type="local_shell_call",
    output_type="local_shell_call_output",
    id_prefix="lsh",
    output_prefix="lsho",
    field="action",
    added=lambda identity, call_id, args: {
        "call_id": call_id,
        "action": {"type": "exec", "command": [], "env": {}},
    },
    lifted=local_shell_action,
    flat=_by_type("local_shell"),
    lowered=_shell_action,
)


def _mcp_flat(names: ResponsesToolNames, item: Mapping[str, Any]) -> str:
    return names.encode(item.get("server_label") or None, item["name"], "mcp")


MCP = CallKind(
    kind="mcp",
    call_type="mcp_call",
    output_type="mcp_call_output",  # the result as history replays it (core/mcp_history.py)
    id_prefix="mcp",
    output_prefix="mcpo",
    field="arguments",
    added=lambda identity, call_id, args: {
        "server_label": identity.namespace or "",
        "name": identity.name,
        "arguments": "",
        "approval_request_id": None,
        "error": None,
        "output": None,
    },
    lifted=str,
    flat=_mcp_flat,
    lowered=lambda item: item.get("arguments") or "{}",
    events=("response.mcp_call_arguments.delta", "response.mcp_call_arguments.done"),
    statuses=("in_progress", "completed", "incomplete", "calling", "failed"),
    hosted=True,
)

CALL_KINDS: dict[str, CallKind] = {
    row.kind: row
    for row in (
        FUNCTION,
        CUSTOM,
        TOOL_SEARCH,
        LOCAL_SHELL,
        MCP,
        *map(_client_row, CLIENT_TOOLS.values()),
    )
}
"""By the identity's kind; any other kind (a name the map does not know) is a function."""
BY_CALL_TYPE: dict[str, CallKind] = {row.call_type: row for row in CALL_KINDS.values()}
BY_OUTPUT_TYPE: dict[str, CallKind] = {row.output_type: row for row in CALL_KINDS.values()}
CALL_TYPES = tuple(BY_CALL_TYPE)
OUTPUT_TYPES = tuple(BY_OUTPUT_TYPE)


def new_call_item(
    identity: ToolIdentity,
    call_id: str,
    make_id: Callable[[str], str],
    args: Sequence[str] = (),
) -> dict[str, Any]:
    """The output item for a call, by the kind of tool its flat name decodes to. A shell or
    apply_patch call is added whole (it never streams live): `args` are its arguments."""
    row = CALL_KINDS.get(identity.kind, FUNCTION)
    item = {"id": make_id(row.id_prefix), "type": row.call_type, "status": "in_progress"}
    item.update(row.added(identity, call_id, args))
    return item
