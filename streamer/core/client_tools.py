"""`shell` and `apply_patch`: OpenAI's client-executed tools, lowered as functions (pure).

The Agents SDK's `ShellTool` / `ApplyPatchTool` and the AI SDK's `openai.tools.shell` /
`applyPatch` declare them; the client runs the calls. A Chat backend has neither, so each is
one function whose arguments are the call's `action` (shell) or `operation` (apply_patch);
the backend's call comes back as a `shell_call` / `apply_patch_call` item (decoded through
the tool map: the flat name's identity has the tool's kind), and those items and their
outputs replay as a tool call and a tool message. A `shell` tool with a hosted container
environment is OpenAI's to run: echoed, never sent. Each kind is one `ClientTool` row.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from streamer.core.errors import invalid
from streamer.core.json_bounds import MAX_ITEM_DEPTH, loads_within

ClientKind = Literal["shell", "apply_patch"]
PATCH_OPERATIONS = ("create_file", "update_file", "delete_file")
_CALL_STATUSES = ("in_progress", "completed", "incomplete")
_LOCAL = (None, "local")  # a shell environment the client runs (absent: local, as OpenAI)

SHELL_DESCRIPTION = (
    "Run shell commands on the user's machine and get their output. `commands` are run one"
    ' after another, each a full shell command line (e.g. "ls -la"); `timeout_ms` and'
    " `max_output_length` (characters of output to keep) are optional limits."
)
SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "commands": {"type": "array", "items": {"type": "string"}},
        "timeout_ms": {"type": "integer"},
        "max_output_length": {"type": "integer"},
    },
    "required": ["commands"],
    "additionalProperties": False,
}
APPLY_PATCH_DESCRIPTION = (
    "Create, update or delete one file on the user's machine. `type` is create_file,"
    " update_file or delete_file; `path` is relative to the workspace root. `diff` (not for"
    " delete_file) is a V4A diff: for create_file every line of the new file prefixed with"
    ' "+"; for update_file, hunks that start with "@@" (optionally followed by a line of'
    ' context such as a function signature) and lines prefixed with " " (unchanged), "-"'
    ' (removed) or "+" (added).'
)
APPLY_PATCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": list(PATCH_OPERATIONS)},
        "path": {"type": "string"},
        "diff": {"type": "string"},
    },
    "required": ["type", "path"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class ClientTool:
    """Everything the gateway does with one client-executed tool kind."""

    kind: ClientKind  # the tool's `type`, its identity's name and kind
    call_type: str  # the output/input item of a call
    output_type: str  # the input item that answers it
    id_prefix: str
    field: str  # the call item's field that the function's arguments are
    description: str
    parameters: dict[str, Any]
    from_arguments: Callable[[dict[str, Any]], dict[str, Any]]  # backend args -> `field`
    statuses: tuple[str, ...]  # what the call item's status may be
    render_output: Callable[[Mapping[str, Any]], str]  # output item -> tool message text

    def declaration(self) -> tuple[dict[str, Any], str]:
        """The backend function's parameters (a fresh copy: callers may mutate it) and text."""
        return copy.deepcopy(self.parameters), self.description

    def call_fields(self, arguments: str) -> dict[str, Any]:
        """The call item's `field` from the arguments the backend gave the function."""
        try:
            value = loads_within(arguments or "{}", MAX_ITEM_DEPTH - 1)
        except orjson.JSONDecodeError:
            value = {}  # a call cut off mid-arguments (its status says so), or too deep
        return {self.field: self.from_arguments(value if isinstance(value, dict) else {})}

    def status(self, status: str) -> str:
        """The item's status in this type's enum (apply_patch_call has no `incomplete`)."""
        return status if status in self.statuses else "in_progress"

    def replay_arguments(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """A history call item's `field` as the function's arguments (nulls left out)."""
        return {k: v for k, v in item[self.field].items() if v is not None}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shell_action(args: dict[str, Any]) -> dict[str, Any]:
    """A `shell_call`'s action: `commands` as strings (one string is one command), the
    optional limits when they are integers."""
    commands = args.get("commands", args.get("command"))  # `command`: a local_shell habit
    if isinstance(commands, str):
        commands = [commands]
    elif isinstance(commands, list):
        commands = [c if isinstance(c, str) else orjson.dumps(c).decode() for c in commands]
    else:
        commands = []
    action: dict[str, Any] = {"commands": commands}
    for key in ("timeout_ms", "max_output_length"):
        value = _int(args.get(key))
        if value is not None:
            action[key] = value
    return action


def patch_operation(args: dict[str, Any]) -> dict[str, Any]:
    """An `apply_patch_call`'s operation. A missing or unknown `type` is `update_file`: it
    never deletes or overwrites a file on a guess, and fails in the client's editor if the
    file is not there (the model sees why)."""
    nested = args.get("operation")
    if isinstance(nested, dict):  # a model that wrapped the operation as OpenAI's item does
        args = nested
    kind = args.get("type")
    if kind not in PATCH_OPERATIONS:
        kind = "update_file"
    path = args.get("path")
    operation: dict[str, Any] = {"type": kind, "path": path if isinstance(path, str) else ""}
    if kind != "delete_file":
        diff = args.get("diff")
        operation["diff"] = diff if isinstance(diff, str) else ""
    return operation


def shell_output_text(item: Mapping[str, Any]) -> str:
    """A `shell_call_output` for the model: each command's stdout, its stderr, its outcome."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    lines: list[str] = []
    for chunk in output or ():
        if not isinstance(chunk, Mapping):
            continue
        stdout, stderr = chunk.get("stdout"), chunk.get("stderr")
        if stdout:
            lines.append(stdout.rstrip("\n"))
        if stderr:
            lines.append("[stderr]\n" + stderr.rstrip("\n"))
        outcome = chunk.get("outcome")
        if isinstance(outcome, Mapping) and outcome.get("type") == "timeout":
            lines.append("[timed out]")
        elif isinstance(outcome, Mapping) and _int(outcome.get("exit_code")) is not None:
            lines.append(f"[exit code {outcome['exit_code']}]")
    return "\n".join(lines)


def patch_output_text(item: Mapping[str, Any]) -> str:
    """An `apply_patch_call_output` for the model: its log, and whether the patch failed."""
    text = item.get("output") or ""
    if item.get("status") == "failed":
        return f"The patch failed: {text}" if text else "The patch failed."
    return text or "The patch was applied."


SHELL = ClientTool(
    kind="shell",
    call_type="shell_call",
    output_type="shell_call_output",
    id_prefix="shc",
    field="action",
    description=SHELL_DESCRIPTION,
    parameters=SHELL_PARAMETERS,
    from_arguments=shell_action,
    statuses=_CALL_STATUSES,
    render_output=shell_output_text,
)
APPLY_PATCH = ClientTool(
    kind="apply_patch",
    call_type="apply_patch_call",
    output_type="apply_patch_call_output",
    id_prefix="apc",
    field="operation",
    description=APPLY_PATCH_DESCRIPTION,
    parameters=APPLY_PATCH_PARAMETERS,
    from_arguments=patch_operation,
    statuses=("in_progress", "completed"),
    render_output=patch_output_text,
)

CLIENT_TOOLS: dict[str, ClientTool] = {t.kind: t for t in (SHELL, APPLY_PATCH)}
BY_CALL_TYPE: dict[str, ClientTool] = {t.call_type: t for t in CLIENT_TOOLS.values()}
BY_OUTPUT_TYPE: dict[str, ClientTool] = {t.output_type: t for t in CLIENT_TOOLS.values()}


def runs_on_client(tool: Mapping[str, Any], path: str) -> bool:
    """Whether a `shell`/`apply_patch` tool is the client's to run (a 400 for a malformed
    environment). A shell in a hosted container (`container_auto`, `container_reference`)
    is OpenAI's: echoed, never sent to the backend."""
    if "environment" not in tool or tool["environment"] is None:
        return True
    env = tool["environment"]
    if not isinstance(env, Mapping):
        raise invalid("A shell tool's 'environment' must be an object.", f"{path}.environment")
    kind = env.get("type")
    if kind is not None and not isinstance(kind, str):
        raise invalid("An environment needs a string 'type'.", f"{path}.environment.type")
    return kind in _LOCAL
