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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from streamer.core.backend_tools import FLAT, BackendTools
from streamer.core.chat_messages import (
    INSTRUCTIONS_MARK,
    TOOL_MEDIA_MARK,
    MessagesState,
    messages,
)
from streamer.core.errors import invalid
from streamer.core.input_items import normalize_input, public_output_to_input
from streamer.core.request_fields import forwarded
from streamer.core.tools import FlatTool, ResponsesToolNames

__all__ = [
    "INSTRUCTIONS_MARK",
    "TOOL_MEDIA_MARK",
    "LoweringOptions",
    "lower",
    "nearest_effort",
    "normalize_input",
    "public_output_to_input",
]


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
    *,
    resume: MessagesState | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """The Chat Completions request for `request`, whose effective input is `items`.

    `items` are normalised input items (`normalize_input`'s, the one place input is
    validated), with any history prepended for `previous_response_id`. `resume` and `keep`:
    a turn that continues an earlier one's lowering (core/chat_messages.py `messages`).
    """
    chat: dict[str, Any] = {}
    model = options.model or request.get("model")
    if model:
        chat["model"] = model
    chat["messages"] = messages(request, items, names, options, resume=resume, keep=keep)
    chat.update(_tools(request, names, options))
    chat.update(_sampling(request, options))
    chat.update(forwarded(request, options.accepts, options.profile))
    for key in options.drop:
        chat.pop(key, None)
    return chat  # streaming is the client's to ask for (upstream/chat/client.py), once


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
