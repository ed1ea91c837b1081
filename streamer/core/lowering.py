"""Lowering (pure): a Responses request becomes a Chat Completions request.

Choices that every Chat backend accepts:
- text-only content is sent as one string, parts joined with "\\n" (what vLLM itself does
  with a list of text parts); only user messages with an image or file keep a part list;
- consecutive assistant-side items (messages, tool calls, reasoning) become ONE assistant
  message, so each `tool_calls` message is directly followed by its `tool` messages;
- images and files in a tool's output (Codex's `view_image`) go in one user message right
  after the tool messages (a `tool` message carries text only); the tool message keeps the
  text and a note where each one was; files only when the backend takes them (`file_parts`);
- what Chat cannot carry (file_id images, images in assistant turns, files for a backend
  without file input, encrypted reasoning, unknown items) becomes a short bracketed note or
  is left out of the chat view; it is never an error. Item references are put in by the
  gateway (streamer/core/item_references.py): one that reaches lowering is unknown, a 400.
  Sealed items (compaction, reasoning with `encrypted_content`) are opened before lowering
  (streamer/core/compaction.py `restore`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from streamer.core.backend_tools import FLAT, BackendTools
from streamer.core.call_kinds import BY_CALL_TYPE, CALL_TYPES, FUNCTION, OUTPUT_TYPES
from streamer.core.client_tools import BY_OUTPUT_TYPE as CLIENT_OUTPUTS
from streamer.core.errors import invalid
from streamer.core.input_items import (
    TEXT_PARTS,
    normalize_input,
    output_call_id,
    public_output_to_input,
)
from streamer.core.item_references import not_found
from streamer.core.request_fields import forwarded
from streamer.core.tools import FlatTool, ResponsesToolNames

__all__ = [
    "LoweringOptions",
    "lower",
    "nearest_effort",
    "normalize_input",
    "public_output_to_input",
]

_SYSTEM_ROLES = ("system", "developer")
INSTRUCTIONS_MARK = "[Instructions from the developer, not the user]"
"""Heads a later system/developer message sent as a user message (`system_messages="user"`)."""
_CHAT_DETAILS = ("auto", "low", "high")
TOOL_MEDIA_MARK = "[Attached by the output of tool call"
"""Heads the images/files of one call's output in the user message after the tool messages."""
_MOVED = {
    "image_url": "[image: sent in the next message]",
    "file": "[file: sent in the next message]",
}


@dataclass(frozen=True)
class LoweringOptions:
    model: str | None = None
    """Overrides the client's model for the backend."""
    replay_reasoning: bool = True
    """Replay readable reasoning on the next assistant message (DeepSeek, Kimi and GLM
    require it in a tool loop; a backend without readable reasoning has no use for it)."""
    reasoning_field: str = "reasoning_content"
    """The assistant message field it is replayed in (`reasoning` for vLLM, OpenRouter)."""
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    system_messages: Literal["merge", "keep", "user"] = "merge"
    """merge: one leading system message joining `instructions` and every system/developer
    message in order (chat templates of Qwen, Mistral, Llama reject a later one); keep: each
    where it is; user: later ones become user messages marked as instructions."""
    tool_choice_object: bool = False
    """A forced single tool as a named object; else "required" over the narrowed list."""
    required_choice: bool = True
    """Send "required" when calls are forced; else "auto" (over the narrowed list): Kimi
    with thinking answers 400 to a forced choice, GLM takes only "auto"."""
    efforts: tuple[str, ...] | None = ("low", "medium", "high")
    """The reasoning efforts the backend takes (None: any); others map to the nearest."""
    drop: frozenset[str] = frozenset({"user"})
    """Chat parameters left out of the request (the backend rejects them)."""
    file_parts: bool = True
    """`input_file` parts go to the backend as Chat `file` parts; else a note in the text."""
    accepts: frozenset[str] = frozenset({"logprobs"})
    """Optional Chat parameters the backend takes (`request_fields.OPTIONAL_PARAMS`)."""
    profile: str = ""
    """The backend profile's name, for messages."""
    tools: BackendTools = FLAT
    """The tool forms the backend takes as they are (its kind's row for the profile); the
    Chat lowering flattens every tool to a function whatever it says."""
    max_output_tokens: int | None = None
    """The model's output token limit when the request gives none (`max_output_tokens` in
    `--config` or `--model-metadata`): sent by the kinds that require one (Anthropic's)."""
    output_limits: tuple[tuple[str, int], ...] = ()
    """The same by the request's `model`, for a catch-all model (`--model-metadata`'s own
    entries); the request's model found here wins over `max_output_tokens`."""


def lower(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions = LoweringOptions(),
) -> dict[str, Any]:
    """The Chat Completions request for `request`, whose effective input is `items`.

    `items` are normalised input items (`normalize_input`'s, the one place input is
    validated), with any history prepended for `previous_response_id`.
    """
    chat: dict[str, Any] = {}
    model = options.model or request.get("model")
    if model:
        chat["model"] = model
    chat["messages"] = _messages(request, items, names, options)
    chat.update(_tools(request, names, options))
    chat.update(_sampling(request, options))
    chat.update(forwarded(request, options.accepts, options.profile))
    for key in options.drop:
        chat.pop(key, None)
    return chat  # streaming is the client's to ask for (upstream/chat/client.py), once


# -- messages -----------------------------------------------------------------------------


class _Messages:
    """Builds the chat message list; holds the one assistant message still open."""

    def __init__(self, names: ResponsesToolNames, options: LoweringOptions) -> None:
        self.names = names
        self.replay_reasoning = options.replay_reasoning
        self.reasoning_field = options.reasoning_field
        self.system_policy = options.system_messages
        self.leading: list[str] = []  # system texts for the one leading message (not "keep")
        self.out: list[dict[str, Any]] = []
        self.texts: list[str] | None = None  # the open assistant message's text pieces
        self.calls: list[dict[str, Any]] = []
        self.reasoning: list[str] = []
        self.search_ids: deque[str] = deque()  # synthesised ids of call_id-less searches
        self.file_parts = options.file_parts
        self.media: list[dict[str, Any]] = []  # tool outputs' images/files, for a user message

    def open(self) -> list[str]:
        if self.texts is None:
            self.texts = []
        return self.texts

    def close(self) -> None:
        """Ends the open assistant message, if any; unattached reasoning is dropped."""
        if self.texts is not None:
            text = "\n".join(self.texts)
            msg: dict[str, Any] = {"role": "assistant"}
            msg["content"] = text if text or not self.calls else None
            if self.calls:
                msg["tool_calls"] = self.calls
            if self.reasoning:
                msg[self.reasoning_field] = "\n\n".join(self.reasoning)
            self.out.append(msg)
        self.texts, self.calls, self.reasoning = None, [], []

    def flush_media(self) -> None:
        """The images and files of the tool outputs just added, as one user message."""
        if self.media:
            self.out.append({"role": "user", "content": self.media})
            self.media = []

    def add(self, index: int, item: dict[str, Any]) -> None:
        kind = item.get("type", "item_reference")
        if kind not in OUTPUT_TYPES:
            self.flush_media()  # after the run of tool messages, before anything else
        if kind == "item_reference":  # the gateway puts the items in; this one is unknown
            raise not_found(str(item.get("id")), index)
        if kind == "message":
            self.message(item)
        elif kind in CALL_TYPES:
            self.open()
            self.calls.append(self.tool_call(index, item))
        elif kind in OUTPUT_TYPES:
            call_id = output_call_id(item)
            if not call_id and kind == "tool_search_output" and self.search_ids:
                call_id = self.search_ids.popleft()
            if not call_id:
                return  # a result with nothing to answer: its tools are still callable
            self.close()
            content, media = self.result(item)
            self.out.append({"role": "tool", "tool_call_id": call_id, "content": content})
            if media:
                self.media.append({"type": "text", "text": f"{TOOL_MEDIA_MARK} {call_id}]"})
                self.media.extend(media)
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text and self.replay_reasoning:
                self.reasoning.append(text)  # attaches to the next assistant message

    def message(self, item: dict[str, Any]) -> None:
        role, content = item["role"], item["content"]
        if role == "assistant":
            self.open().append(_text(content))
            return
        if role in _SYSTEM_ROLES:
            self.system(_text(content))
            return
        self.close()
        self.out.append({"role": "user", "content": _user_content(content, self.file_parts)})

    def system(self, text: str) -> None:
        """A system/developer message, placed by the policy (`LoweringOptions.system_messages`)."""
        policy = self.system_policy
        if policy == "merge" or (policy == "user" and not self.out and self.texts is None):
            self.leading.append(text)  # merge: the open assistant message stays open
            return
        self.close()
        if policy == "keep":
            self.out.append({"role": "system", "content": text})
        else:
            self.out.append({"role": "user", "content": f"{INSTRUCTIONS_MARK}\n{text}"})

    def leading_system(self) -> list[dict[str, Any]]:
        if not self.leading:
            return []
        return [{"role": "system", "content": "\n\n".join(self.leading)}]

    def tool_call(self, index: int, item: dict[str, Any]) -> dict[str, Any]:
        """A history call item as the assistant's function call (its kind's row says how)."""
        row = BY_CALL_TYPE[item["type"]]
        flat, arguments = row.as_function(self.names, index, item)
        if row is FUNCTION:
            arguments = self.whole_arguments(arguments, item)
        if not arguments.strip():
            arguments = "{}"  # vLLM parses replayed arguments as JSON
        call_id = item.get("call_id")
        if not call_id:  # server-executed search carries none; pair it with its output
            call_id = f"tool_search_{index}"
            self.search_ids.append(call_id)
        function = {"name": flat, "arguments": arguments}
        return {"id": call_id, "type": "function", "function": function}

    def whole_arguments(self, arguments: str, item: dict[str, Any]) -> str:
        """Replayed arguments a backend can parse: a call cut off mid-arguments (its answer
        ended on `length`) is sent with `{}`, and a note in the assistant's text says so."""
        if not arguments.strip():
            return arguments
        try:
            orjson.loads(arguments)
        except orjson.JSONDecodeError:
            self.open().append(
                f"(The call to {item['name']} was cut off before its arguments were complete;"
                " they were not valid JSON and are dropped.)"
            )
            return "{}"
        return arguments

    def result(self, item: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """A tool message's text, and the images/files that go in the user message after it."""
        if item["type"] == "tool_search_output":
            return self.loaded_tools(item.get("tools") or []), []
        client = CLIENT_OUTPUTS.get(item["type"])
        if client is not None:  # shell and apply_patch outputs are not content parts
            return client.render_output(item), []
        output = item["output"]
        if isinstance(output, str):
            return output, []
        texts: list[str] = []
        media: list[dict[str, Any]] = []
        for part in output:
            lowered = _user_part(part, self.file_parts)
            if lowered["type"] == "text":
                texts.append(lowered["text"])
            else:
                media.append(lowered)
                texts.append(_MOVED[lowered["type"]])
        return "\n".join(texts), media

    def loaded_tools(self, tools: list[Any]) -> str:
        """What a tool search found, as the flat names the backend can now call."""
        lines: list[str] = []
        for tool in tools:
            if not isinstance(tool, dict):
                continue
            if tool.get("type") == "namespace":
                ns, members = tool.get("name"), tool.get("tools")
                if isinstance(ns, str) and isinstance(members, list):
                    lines.extend(self.tool_line(ns, m) for m in members if isinstance(m, dict))
            else:
                lines.append(self.tool_line(None, tool))
        lines = [line for line in lines if line]
        if not lines:
            return "No tools were loaded."
        return "Loaded tools, now callable:\n" + "\n".join(lines)

    def tool_line(self, namespace: str | None, tool: dict[str, Any]) -> str:
        kind, name = tool.get("type"), tool.get("name")
        if kind not in ("function", "custom") or not isinstance(name, str) or not name:
            return ""  # hosted tools are not callable through the backend
        flat = self.names.encode(namespace, name, kind)  # the name convert() declared
        description = tool.get("description")  # the client's own, without grammar
        return f"- {flat}: {description}" if description else f"- {flat}"


def _messages(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
) -> list[dict[str, Any]]:
    builder = _Messages(names, options)
    instructions = request.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("Invalid type for 'instructions': expected a string.", "instructions")
    if instructions:
        builder.system(instructions)
    for index, item in enumerate(items):
        builder.add(index, item)
    builder.close()
    builder.flush_media()
    return builder.leading_system() + builder.out


def _json(value: Any, param: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:  # >64-bit integers, lone surrogates
        raise invalid(f"Invalid value for '{param}': {exc}.", param) from None


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_part_text(p) for p in content)


def _part_text(part: dict[str, Any]) -> str:
    """A content part as text: its text, or a short note for what text cannot carry."""
    kind = part["type"]
    if kind in TEXT_PARTS:
        return part["text"]
    if kind == "refusal":
        return part["refusal"]
    if kind == "input_image":
        url = part.get("image_url")
        if url and not url.startswith("data:"):
            return f"[image: {url}]"
        return f"[image omitted: file {part['file_id']}]" if not url else "[image omitted]"
    name = part.get("filename") or part.get("file_id") or part.get("file_url")
    return f"[file omitted: {name}]" if name else "[file omitted]"


def _user_content(
    content: str | list[dict[str, Any]], file_parts: bool
) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    lowered = [_user_part(p, file_parts) for p in content]
    if all(p["type"] == "text" for p in lowered):
        return "\n".join(p["text"] for p in lowered)
    return lowered


def _user_part(part: dict[str, Any], file_parts: bool) -> dict[str, Any]:
    kind = part["type"]
    if kind == "input_image" and part.get("image_url"):
        image: dict[str, Any] = {"url": part["image_url"]}
        detail = part.get("detail")
        if detail in _CHAT_DETAILS:
            image["detail"] = detail
        elif detail == "original":
            image["detail"] = "high"  # Chat's closest level
        return {"type": "image_url", "image_url": image}
    if kind == "input_file" and (part.get("file_id") or part.get("file_data")):
        if not file_parts:
            name = part.get("filename") or part.get("file_id") or "a file"
            return {"type": "text", "text": f"[file omitted: {name}; the backend takes no files]"}
        file = {k: part[k] for k in ("file_id", "file_data", "filename") if part.get(k)}
        return {"type": "file", "file": file}
    return {"type": "text", "text": _part_text(part)}


EFFORT_SCALE = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""Reasoning efforts from least to most: a value a backend does not take becomes the
nearest one it does (ties go to the lesser effort). "none" is no reasoning, not a level:
a backend that does not take it gets no effort at all, never a higher one."""


def nearest_effort(effort: str, accepted: tuple[str, ...] | None) -> str | None:
    """`effort` as the backend takes it: itself, the nearest accepted value, or None."""
    if accepted is None or effort in accepted:
        return effort
    if effort == "none":
        return None  # mapped up, "no reasoning" would become "some reasoning"
    known = [a for a in accepted if a in EFFORT_SCALE]
    if effort not in EFFORT_SCALE or not known:
        return None  # a value nobody ranks, or a backend that takes none: not sent
    rank = EFFORT_SCALE.index(effort)
    return min(known, key=lambda a: (abs(EFFORT_SCALE.index(a) - rank), EFFORT_SCALE.index(a)))


def _reasoning_text(item: dict[str, Any]) -> str:
    """Readable reasoning: `reasoning_text` content, else the summaries; "" if encrypted only."""
    for field, kind, sep in (
        ("content", "reasoning_text", "\n"),
        ("summary", "summary_text", "\n\n"),
    ):
        parts = item.get(field)
        if isinstance(parts, list):
            texts = [
                p["text"]
                for p in parts
                if isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
            ]
            text = sep.join(t for t in texts if t)
            if text:
                return text
    return ""


# -- tools and sampling -------------------------------------------------------------------


def _tools(
    request: Mapping[str, Any], names: ResponsesToolNames, options: LoweringOptions
) -> dict[str, Any]:
    choice = names.resolve_choice(request.get("tool_choice"))  # 400s even with no tools
    tools = names.tools
    tool_choice: Any = choice.mode
    if choice.allowed is not None:
        forced = len(choice.allowed) == 1 and choice.mode == "required"
        if forced and options.tool_choice_object:
            tool_choice = {"type": "function", "function": {"name": choice.allowed[0]}}
        else:  # filtering the list is the one form of allowed_tools every backend accepts
            # (llama.cpp reads a named object as "auto": "required" over the narrowed list)
            allowed = set(choice.allowed)
            tools = [t for t in tools if t.name in allowed]
    if not tools:
        return {}
    if tool_choice == "required" and not options.required_choice:
        tool_choice = "auto"
    out: dict[str, Any] = {"tools": [_chat_tool(t) for t in tools], "tool_choice": tool_choice}
    parallel = request.get("parallel_tool_calls")
    if isinstance(parallel, bool):
        out["parallel_tool_calls"] = parallel
    return out


def _chat_tool(tool: FlatTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _sampling(request: Mapping[str, Any], options: LoweringOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if request.get("max_output_tokens") is not None:
        out[options.max_tokens_field] = request["max_output_tokens"]
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if request.get(key) is not None:
            out[key] = request[key]
    text = request.get("text")
    if isinstance(text, Mapping):
        response_format = _response_format(text.get("format"))
        if response_format is not None:
            out["response_format"] = response_format
    reasoning = request.get("reasoning")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("effort"), str):
        effort = nearest_effort(reasoning["effort"], options.efforts)
        if effort is not None:
            out["reasoning_effort"] = effort
    return out


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") != "json_schema":
        return None  # "text" is Chat's default; anything else has no Chat form
    if not isinstance(fmt.get("schema"), Mapping):
        raise invalid(
            "Missing required parameter: 'text.format.schema' (an object).", "text.format.schema"
        )
    schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
    for key in ("strict", "description"):
        if fmt.get(key) is not None:
            schema[key] = fmt[key]
    return {"type": "json_schema", "json_schema": schema}
