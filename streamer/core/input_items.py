"""Responses `input` items: normalisation and validation (pure).

Strict only where an item could not be lowered to Chat Completions; unknown fields and
unknown item types pass through untouched. Every error is a 400 whose `param` points at
the offending field, e.g. `input[3].content[1].type`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streamer.core.client_tools import PATCH_OPERATIONS
from streamer.core.errors import invalid

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
MESSAGE_PARTS = (*TEXT_PARTS, "refusal", "input_image", "input_file")
OUTPUT_PARTS = (*TEXT_PARTS, "input_image", "input_file")


def normalize_input(value: Any, start: int = 0) -> list[dict[str, Any]]:
    """`input` (a string, a list of items, or absent) -> validated items.

    A string is one user message; a bare `{role, content}` gains `type: "message"`; every
    other item is returned as given. Idempotent, so lowering can re-run it safely.
    `start`: the index in the client's `input` of `value`'s first item (the `param` paths
    of a tail of it, whose head was validated before).
    """
    if value is None:
        return []
    if isinstance(value, str):
        part = {"type": "input_text", "text": value}
        return [{"type": "message", "role": "user", "content": [part]}]
    if not isinstance(value, list):
        raise invalid(
            "Invalid type for 'input': expected a string or an array of input items.", "input"
        )
    out: list[dict[str, Any]] = []
    append = out.append
    for i, item in enumerate(value, start):
        if PLAIN_ITEMS and item.__class__ is dict and _plain(item):
            append(item)
        else:
            append(_item(item, f"input[{i}]"))
    return out


PLAIN_ITEMS = True
"""Take the plain items by `_plain`'s type checks; False: every item through `_item`."""


def _plain(item: dict[str, Any]) -> bool:
    """The items a tool loop is made of, in their plain shapes (string fields only), which
    `_item` would return as they are: checked by type, here, without its calls
    (tests/test_plain_paths.py holds the two to the same answers)."""
    kind = item.get("type")
    if kind == "function_call_output":
        call_id = item.get("call_id")
        return call_id.__class__ is str and call_id != "" and item.get("output").__class__ is str
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        arguments, namespace = item.get("arguments"), item.get("namespace")
        return (
            call_id.__class__ is str
            and call_id != ""
            and name.__class__ is str
            and name != ""
            and (arguments is None or arguments.__class__ is str)
            and (namespace is None or namespace.__class__ is str)
        )
    if kind == "message":
        return item.get("role") in ROLES and item.get("content").__class__ is str
    return False


def public_output_to_input(output_items: Iterable[Any]) -> list[dict[str, Any]]:
    """A previous response's output items -> input items for its continuation.

    The public output shapes (function_call with bare `name` + `namespace`, messages,
    reasoning, custom and tool-search calls) are already valid input items, so this is a
    shallow copy that keeps every field (ids, status, phase, namespace, encrypted content);
    the copy stops later edits of the continuation from reaching the stored response.
    """
    return [dict(item) for item in output_items if isinstance(item, Mapping)]


def _item(item: Any, path: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid(f"Invalid type for '{path}': expected an object.", path)
    kind = item.get("type")
    if kind is None:
        if "role" in item:
            _message(item, path)
            return {**item, "type": "message"}
        if "id" in item:  # `type` is optional on item_reference
            return item
        raise invalid(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    if not isinstance(kind, str):
        raise invalid(f"Invalid type for '{path}.type': expected a string.", f"{path}.type")
    check = _CHECKS.get(kind)
    if check is not None:
        check(item, path)
    return item


def _message(item: dict[str, Any], path: str) -> None:
    role = item.get("role")
    if role is None:
        raise invalid(f"Missing required parameter: '{path}.role'.", f"{path}.role")
    if role not in ROLES:
        raise invalid(
            f"Invalid value for '{path}.role': {role!r}. Supported values are: "
            "'user', 'assistant', 'system' and 'developer'.",
            f"{path}.role",
        )
    content = item.get("content")
    if "content" not in item:
        raise invalid(f"Missing required parameter: '{path}.content'.", f"{path}.content")
    _text_or_parts(content, f"{path}.content", MESSAGE_PARTS)


def _part(part: Any, path: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(part, dict):
        raise invalid(f"Invalid type for '{path}': expected an object.", path)
    kind = part.get("type")
    if kind is None:
        raise invalid(f"Missing required parameter: '{path}.type'.", f"{path}.type")
    if kind not in allowed:
        supported = ", ".join(repr(a) for a in allowed)
        raise invalid(
            f"Invalid value for '{path}.type': {kind!r}. Supported values are: {supported}.",
            f"{path}.type",
        )
    if kind in TEXT_PARTS or kind == "refusal":
        field = "refusal" if kind == "refusal" else "text"
        _require_str(part, field, path)
    elif kind == "input_image":
        url, file_id = part.get("image_url"), part.get("file_id")
        if url is not None and not isinstance(url, str):
            raise invalid(
                f"Invalid type for '{path}.image_url': expected a string.", f"{path}.image_url"
            )
        if file_id is not None and not isinstance(file_id, str):
            raise invalid(
                f"Invalid type for '{path}.file_id': expected a string.", f"{path}.file_id"
            )
        if not url and not file_id:
            raise invalid(
                f"Missing required parameter: '{path}.image_url' (or '{path}.file_id').",
                f"{path}.image_url",
            )
    else:  # input_file
        sources = [part.get(k) for k in ("file_id", "file_data", "file_url")]
        for key in ("file_id", "file_data", "file_url", "filename"):
            if part.get(key) is not None and not isinstance(part[key], str):
                raise invalid(
                    f"Invalid type for '{path}.{key}': expected a string.", f"{path}.{key}"
                )
        if not any(sources):
            raise invalid(
                f"Missing required parameter: '{path}.file_id' (or 'file_data' or 'file_url').",
                f"{path}.file_id",
            )


def _require_str(item: Mapping[str, Any], key: str, path: str, *, nonempty: bool = False) -> None:
    value = item.get(key)
    if value is None:
        raise invalid(f"Missing required parameter: '{path}.{key}'.", f"{path}.{key}")
    if not isinstance(value, str):
        raise invalid(f"Invalid type for '{path}.{key}': expected a string.", f"{path}.{key}")
    if nonempty and not value:
        raise invalid(
            f"Invalid '{path}.{key}': empty string. Expected a string with at least 1 character.",
            f"{path}.{key}",
        )


def _optional_str(item: Mapping[str, Any], key: str, path: str) -> None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid(f"Invalid type for '{path}.{key}': expected a string.", f"{path}.{key}")


def _function_call(item: dict[str, Any], path: str) -> None:
    _require_str(item, "call_id", path, nonempty=True)
    _require_str(item, "name", path, nonempty=True)
    _optional_str(item, "arguments", path)  # absent lowers as "{}"
    _optional_str(item, "namespace", path)


def _custom_tool_call(item: dict[str, Any], path: str) -> None:
    _require_str(item, "call_id", path, nonempty=True)
    _require_str(item, "name", path, nonempty=True)
    _optional_str(item, "input", path)  # absent lowers as ""
    _optional_str(item, "namespace", path)


def _call_output(item: dict[str, Any], path: str) -> None:
    _require_str(item, "call_id", path, nonempty=True)
    output = item.get("output")
    if output is None:
        raise invalid(f"Missing required parameter: '{path}.output'.", f"{path}.output")
    _text_or_parts(output, f"{path}.output", OUTPUT_PARTS)


def _tool_search_call(item: dict[str, Any], path: str) -> None:
    _optional_str(item, "call_id", path)  # null for server-executed search
    arguments = item.get("arguments")
    if arguments is not None and not isinstance(arguments, dict | str):
        raise invalid(
            f"Invalid type for '{path}.arguments': expected an object.", f"{path}.arguments"
        )


def _tool_search_output(item: dict[str, Any], path: str) -> None:
    _optional_str(item, "call_id", path)
    tools = item.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid(f"Invalid type for '{path}.tools': expected an array.", f"{path}.tools")


def _shell_action(item: dict[str, Any], path: str, commands: str) -> dict[str, Any]:
    """A (local) shell call's `call_id` and `action`, whose `commands` key holds strings."""
    _require_str(item, "call_id", path, nonempty=True)
    action = item.get("action")
    if not isinstance(action, dict):
        raise invalid(f"Missing required parameter: '{path}.action' (an object).", f"{path}.action")
    value = action.get(commands)
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise invalid(
            f"Invalid type for '{path}.action.{commands}': expected an array of strings.",
            f"{path}.action.{commands}",
        )
    return action


def _local_shell_call(item: dict[str, Any], path: str) -> None:
    _shell_action(item, path, "command")


def _local_shell_output(item: dict[str, Any], path: str) -> None:
    """`id` is the call's id in OpenAI's shape; some clients send `call_id` instead."""
    key = "call_id" if item.get("call_id") is not None else "id"
    _require_str(item, key, path, nonempty=True)
    output = item.get("output")
    if output is None:
        raise invalid(f"Missing required parameter: '{path}.output'.", f"{path}.output")
    _text_or_parts(output, f"{path}.output", OUTPUT_PARTS)


def _shell_call(item: dict[str, Any], path: str) -> None:
    action = _shell_action(item, path, "commands")
    for key in ("timeout_ms", "max_output_length"):
        value = action.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise invalid(
                f"Invalid type for '{path}.action.{key}': expected an integer.",
                f"{path}.action.{key}",
            )


def _shell_output(item: dict[str, Any], path: str) -> None:
    """`output`: the commands' chunks ({stdout, stderr, outcome}); a string is taken too."""
    _require_str(item, "call_id", path, nonempty=True)
    output = item.get("output")
    if isinstance(output, str):
        return
    if not isinstance(output, list):
        raise invalid(
            f"Missing required parameter: '{path}.output' (an array of output chunks).",
            f"{path}.output",
        )
    for j, chunk in enumerate(output):
        where = f"{path}.output[{j}]"
        if not isinstance(chunk, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", where)
        _optional_str(chunk, "stdout", where)
        _optional_str(chunk, "stderr", where)
        outcome = chunk.get("outcome")
        if outcome is not None and not isinstance(outcome, dict):
            raise invalid(
                f"Invalid type for '{where}.outcome': expected an object.", f"{where}.outcome"
            )


def _apply_patch_call(item: dict[str, Any], path: str) -> None:
    _require_str(item, "call_id", path, nonempty=True)
    operation = item.get("operation")
    where = f"{path}.operation"
    if not isinstance(operation, dict):
        raise invalid(f"Missing required parameter: '{where}' (an object).", where)
    if operation.get("type") not in PATCH_OPERATIONS:
        raise invalid(
            f"Invalid value for '{where}.type': {operation.get('type')!r}. Supported values "
            "are: 'create_file', 'update_file' and 'delete_file'.",
            f"{where}.type",
        )
    _require_str(operation, "path", where, nonempty=True)
    _optional_str(operation, "diff", where)


def _apply_patch_output(item: dict[str, Any], path: str) -> None:
    _require_str(item, "call_id", path, nonempty=True)
    _optional_str(item, "output", path)
    _optional_str(item, "status", path)


def output_call_id(item: dict[str, Any]) -> Any:
    """The call a tool output answers (a `local_shell_call_output` may name it by `id`)."""
    call_id = item.get("call_id")
    if call_id is None and item.get("type") == "local_shell_call_output":
        return item.get("id")
    return call_id


_CHECKS = {
    "local_shell_call": _local_shell_call,
    "local_shell_call_output": _local_shell_output,
    "shell_call": _shell_call,
    "shell_call_output": _shell_output,
    "apply_patch_call": _apply_patch_call,
    "apply_patch_call_output": _apply_patch_output,
    "message": _message,
    "function_call": _function_call,
    "custom_tool_call": _custom_tool_call,
    "function_call_output": _call_output,
    "custom_tool_call_output": _call_output,
    "tool_search_call": _tool_search_call,
    "tool_search_output": _tool_search_output,
}


def _text_or_parts(value: Any, where: str, allowed: tuple[str, ...]) -> None:
    """A message's `content` or a call output's `output`: a string, or content parts."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise invalid(
            f"Invalid type for '{where}': expected a string or an array of content parts.", where
        )
    for j, part in enumerate(value):
        _part(part, f"{where}[{j}]", allowed)
