"""Responses input items -> Messages `system` and `messages` (pure).

- `instructions` and every system/developer message join the top-level `system`, in order;
- the rest are `user` and `assistant` messages, strictly alternating: consecutive items of
  one side are merged into one message (Anthropic would merge them too, but a `tool_result`
  must open the user message that answers the `tool_use`s of the message before it);
- calls (function, custom, local_shell, shell, apply_patch, tool_search) are `tool_use`
  blocks with the call's id and its flat name (the naming core's, as for a Chat backend),
  their `input` the arguments as an object (arguments that are not a JSON object are sent
  as `{}`, and a note in the text says so); outputs are `tool_result` blocks with the same
  id, images kept in them. A tool_use no output answers gets a `tool_result` saying so, an
  output no tool_use asked for is sent as text (the API refuses both otherwise). Ids are
  made legal for the API (`[A-Za-z0-9_-]`) the same way on both sides;
- reasoning: the signed thinking blocks the gateway sealed for an answer (blocks.py) go
  back as they came, each run before the `tool_use` it preceded; readable reasoning with no
  signed block goes back as an unsigned thinking block where the profile reads those, and
  is left out otherwise;
- a conversation that would open with the assistant gets a short user message first; one
  that ends with it (the answer continues it) has its last text without trailing blanks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from streamer.core.backend_tools import BACKEND_BLOB
from streamer.core.call_kinds import BY_CALL_TYPE, CALL_TYPES, OUTPUT_TYPES
from streamer.core.client_tools import BY_OUTPUT_TYPE
from streamer.core.errors import invalid
from streamer.core.input_items import output_call_id
from streamer.core.item_references import not_found
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.anthropic.blocks import (
    ThinkingRun,
    content_blocks,
    part_block,
    text_block,
    thinking_runs,
)
from streamer.upstream.anthropic.profiles import MessagesProfile

_SYSTEM_ROLES = ("system", "developer")
_ILLEGAL_ID = re.compile(r"[^A-Za-z0-9_-]")
NO_OUTPUT = "[No output was recorded for this call.]"
OPENING = "[The conversation so far follows.]"
Message = dict[str, Any]


def tool_id(call_id: str) -> str:
    """A call id as the API takes it (`^[a-zA-Z0-9_-]+$`), the same on both sides."""
    legal = _ILLEGAL_ID.sub("_", call_id)[:200]
    return legal or "call"


class _Builder:
    """The message list being built: one open message of each side at most."""

    def __init__(self, names: ResponsesToolNames, profile: MessagesProfile) -> None:
        self.names = names
        self.profile = profile
        self.system: list[str] = []
        self.out: list[Message] = []
        self.runs: list[ThinkingRun] = []  # the open assistant message's sealed thinking
        self.search_ids: list[str] = []  # synthesised ids of call_id-less tool searches

    def side(self, role: str) -> list[dict[str, Any]]:
        """The content of the open message of `role` (a new one if the other side is open)."""
        if not self.out or self.out[-1]["role"] != role:
            self.close()
            self.out.append({"role": role, "content": []})
        content: list[dict[str, Any]] = self.out[-1]["content"]
        return content

    def close(self) -> None:
        """The open assistant message gets its sealed thinking back in place."""
        if self.runs and self.out and self.out[-1]["role"] == "assistant":
            self.out[-1]["content"] = _placed(self.runs, self.out[-1]["content"])
        self.runs = []

    def add(self, index: int, item: dict[str, Any]) -> None:
        kind = item.get("type", "item_reference")
        if kind == "item_reference":  # the gateway puts the items in; this one is unknown
            raise not_found(str(item.get("id")), index)
        if kind == "message":
            self.message(index, item)
        elif kind in CALL_TYPES:
            self.side("assistant").extend(self.tool_use(index, item))
        elif kind in OUTPUT_TYPES:
            self.tool_result(index, item)
        elif kind == "reasoning":
            self.reasoning(item)

    def message(self, index: int, item: dict[str, Any]) -> None:
        role, content = item["role"], item["content"]
        param = f"input[{index}].content"
        if role in _SYSTEM_ROLES:
            text = content if isinstance(content, str) else _texts(content)
            if text:
                self.system.append(text)
            return
        blocks = content_blocks(content, param, self.profile.documents)
        if role == "assistant":  # text only: images and files have no assistant form
            blocks = [b for b in blocks if b["type"] == "text"]
        if blocks:
            self.side("assistant" if role == "assistant" else "user").extend(blocks)

    def reasoning(self, item: dict[str, Any]) -> None:
        runs = thinking_runs(item.get(BACKEND_BLOB))
        if runs:
            self.side("assistant")
            self.runs = runs  # each blob of an answer holds all its runs so far: the last wins
            return
        text = _reasoning_text(item)
        if text and not self.profile.signed_thinking:
            self.side("assistant").append({"type": "thinking", "thinking": text, "signature": ""})

    def tool_use(self, index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
        name, arguments = self.call(index, item)
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:  # a server-run search carries none
            call_id = f"tool_search_{index}"
            self.search_ids.append(call_id)
        use = {"type": "tool_use", "id": tool_id(call_id), "name": name, "input": arguments}
        if isinstance(arguments, dict):
            return [use]
        use["input"] = {}
        note = (
            f"(The call to {name} was cut off before its arguments were complete; they "
            "were not a JSON object and are dropped.)"
        )
        return [text_block(note), use]

    def call(self, index: int, item: dict[str, Any]) -> tuple[str, Any]:
        """The call's flat name and its input (its kind's row says how; not a dict:
        arguments that were not an object)."""
        row = BY_CALL_TYPE[item["type"]]
        value = row.lowered(item)  # a string (a function's arguments) is parsed
        return row.flat(self.names, item), _arguments(value) if isinstance(value, str) else value

    def tool_result(self, index: int, item: dict[str, Any]) -> None:
        call_id = output_call_id(item)
        if not call_id and item["type"] == "tool_search_output" and self.search_ids:
            call_id = self.search_ids.pop(0)
        if not isinstance(call_id, str) or not call_id:
            return  # a result with nothing to answer: its tools are still callable
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id(call_id)}
        content = self.result_content(index, item)
        if content:
            result["content"] = content
        self.side("user").append(result)

    def result_content(self, index: int, item: dict[str, Any]) -> str | list[dict[str, Any]]:
        if item["type"] == "tool_search_output":
            return _loaded_tools(self.names, item.get("tools") or [])
        client = BY_OUTPUT_TYPE.get(item["type"])
        if client is not None:
            return client.render_output(item)
        output = item.get("output")
        if isinstance(output, str) or output is None:
            return output or ""
        param = f"input[{index}].output"
        blocks = [part_block(p, f"{param}[{j}]", False) for j, p in enumerate(output)]
        return [b for b in blocks if b is not None]  # text and images; files as notes


def messages(
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    profile: MessagesProfile,
    instructions: Any = None,
) -> tuple[list[str], list[Message]]:
    """The system texts and the alternating messages of `items`."""
    builder = _Builder(names, profile)
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("Invalid type for 'instructions': expected a string.", "instructions")
    if instructions:
        builder.system.append(instructions)
    for index, item in enumerate(items):
        builder.add(index, item)
    builder.close()
    out = _paired(builder.out)
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [text_block(OPENING)]})
    if out and out[-1]["role"] == "assistant" and out[-1]["content"][-1].get("type") == "text":
        last = out[-1]["content"][-1]  # the answer continues it: no trailing blank (a 400)
        out[-1]["content"][-1] = {**last, "text": last["text"].rstrip()}
    return builder.system, out


def _placed(runs: list[ThinkingRun], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`content` with each run of thinking blocks back where it was: first, or right after
    the tool_use it followed (first when that tool_use is not there)."""
    after: dict[str, list[dict[str, Any]]] = {}
    first: list[dict[str, Any]] = []
    uses = {b.get("id") for b in content if b.get("type") == "tool_use"}
    for run in runs:
        if run.after is not None and tool_id(run.after) in uses:
            after.setdefault(tool_id(run.after), []).extend(run.blocks)
        else:
            first.extend(run.blocks)
    out = [dict(b) for b in first]
    for block in content:
        out.append(block)
        if block.get("type") == "tool_use":
            out.extend(dict(b) for b in after.pop(block["id"], ()))
    return out


def _paired(out: list[Message]) -> list[Message]:
    """Every tool_use answered by a tool_result at the start of the next user message, and
    every tool_result answering one: a missing result is said, an unasked one becomes text."""
    paired: list[Message] = []
    asked: list[str] = []  # the tool_use ids of the assistant message just before
    for message in out:
        if message["role"] == "assistant":  # roles alternate: a user message came before
            paired.append(message)
            asked = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
            continue
        paired.append({"role": "user", "content": _answers(asked, message["content"])})
        asked = []
    if asked:
        paired.append({"role": "user", "content": _answers(asked, [])})
    return paired


def _answers(asked: list[str], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user message's content: the results for `asked` first (in the calls' order), then
    the rest, an unasked result as text."""
    results: dict[str, dict[str, Any]] = {}
    rest: list[dict[str, Any]] = []
    for block in content:
        use_id = block.get("tool_use_id") if block.get("type") == "tool_result" else None
        if use_id in asked and use_id not in results:
            results[use_id] = block
        elif use_id is not None:
            rest.append(text_block(f"[Output of tool call {use_id}]\n{_result_text(block)}"))
        else:
            rest.append(block)
    head = [
        results.get(use_id)
        or {"type": "tool_result", "tool_use_id": use_id, "content": NO_OUTPUT, "is_error": True}
        for use_id in asked
    ]
    return head + rest


def _result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content") or ""
    if isinstance(content, str):
        return content
    return "\n".join(b["text"] if b.get("type") == "text" else "[image]" for b in content)


def _arguments(raw: Any) -> Any:
    """Replayed arguments as the object `input` must be; a non-dict means they were not one
    (an empty string is `{}`: a call without arguments)."""
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _texts(parts: list[dict[str, Any]]) -> str:
    return "\n".join(t for p in parts if isinstance(t := p.get("text"), str) and t)


def _reasoning_text(item: Mapping[str, Any]) -> str:
    """Readable reasoning: `reasoning_text` content, else the summaries."""
    for field, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(field)
        if isinstance(parts, list):
            texts = [
                p["text"]
                for p in parts
                if isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
            ]
            if any(texts):
                return "\n".join(t for t in texts if t)
    return ""


def _loaded_tools(names: ResponsesToolNames, tools: list[Any]) -> str:
    """What a tool search found, as the flat names the backend can now call."""
    lines: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        members = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        namespace = tool.get("name") if tool.get("type") == "namespace" else None
        for member in members if isinstance(members, list) else ():
            if not isinstance(member, dict):
                continue
            kind, name = member.get("type"), member.get("name")
            if kind in ("function", "custom") and isinstance(name, str) and name:
                lines.append(f"- {names.encode(namespace, name, kind)}")
    if not lines:
        return "No tools were loaded."
    return "Loaded tools, now callable:\n" + "\n".join(lines)
