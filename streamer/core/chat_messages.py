"""The Chat message list of a Responses input (pure): the builder `lowering.lower` uses.

Items go in in order (`MessageBuilder.add`, or `_plain_run` for the runs of plain tool-loop
items a history is mostly made of); the builder holds the one assistant message still open.
Its state can be kept (`MessagesState`, with the messages' bytes: core/wire_messages.py) and
resumed by a later turn whose input starts with the same items, so that a long conversation
is lowered, and encoded, once (streamer/turns/history_reuse.py). See core/lowering.py for the
choices every Chat backend accepts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from streamer.core.call_kinds import BY_CALL_TYPE, CALL_TYPES, FUNCTION, OUTPUT_TYPES
from streamer.core.client_tools import BY_OUTPUT_TYPE as CLIENT_OUTPUTS
from streamer.core.errors import invalid
from streamer.core.input_items import TEXT_PARTS, output_call_id
from streamer.core.item_references import not_found
from streamer.core.tools import ResponsesToolNames
from streamer.core.wire_messages import Encoded, LoweredMessages

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


class MessageOptions(Protocol):
    """What the builder reads of the model's lowering options (`LoweringOptions`)."""

    @property
    def replay_reasoning(self) -> bool: ...
    @property
    def reasoning_field(self) -> str: ...
    @property
    def system_messages(self) -> str: ...
    @property
    def file_parts(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class MessagesState:
    """The builder after `count` items, before its end (the open message still open):
    what a later turn with the same first items resumes from. Its messages are shared by
    the turns that resume from it, never changed."""

    count: int
    # the messages so far: `out[:closed]` (a list the builder that made it, or the first to
    # resume it, goes on appending to: the turns of a conversation share one list)
    out: list[dict[str, Any]]
    closed: int
    encoded: Encoded  # the bytes of `out[:closed]`
    leading: tuple[str, ...]
    texts: tuple[str, ...] | None
    calls: tuple[dict[str, Any], ...]
    reasoning: tuple[str, ...]
    search_ids: tuple[str, ...]
    media: tuple[dict[str, Any], ...]


class MessageBuilder:
    """Builds the chat message list; holds the one assistant message still open."""

    def __init__(self, names: ResponsesToolNames, options: MessageOptions) -> None:
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

    @classmethod
    def resumed(
        cls, state: MessagesState, names: ResponsesToolNames, options: MessageOptions
    ) -> MessageBuilder:
        """A builder where `state` left one (its names: the map as it was then)."""
        self = cls(names, options)
        out, closed = state.out, state.closed
        # the first to resume it goes on in its list; any other resumes from a copy
        self.out = out if len(out) == closed else out[:closed]
        self.leading = list(state.leading)
        self.texts = None if state.texts is None else list(state.texts)
        self.calls, self.reasoning = list(state.calls), list(state.reasoning)
        self.search_ids, self.media = deque(state.search_ids), list(state.media)
        return self

    def snapshot(self, count: int, encoded: Encoded) -> MessagesState:
        """The builder now, after `count` items (`encoded`: the bytes of its first messages,
        extended to all of them)."""
        texts = None if self.texts is None else tuple(self.texts)
        return MessagesState(
            count, self.out, len(self.out), encoded.extend(self.out), tuple(self.leading), texts,
            tuple(self.calls), tuple(self.reasoning), tuple(self.search_ids), tuple(self.media),
        )  # fmt: skip

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


def messages(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: MessageOptions,
    *,
    resume: MessagesState | None = None,
    keep: bool = False,
) -> list[dict[str, Any]]:
    """The Chat messages of `items`. `resume`: the state after `items[:resume.count]` (a
    turn before this one, with the same first items, tools and instructions): only the rest
    is lowered. `keep`: the state after all of `items` is kept on the answer, a
    `LoweredMessages` (as it is whenever there is such a state)."""
    instructions = request.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("Invalid type for 'instructions': expected a string.", "instructions")
    if resume is None:
        builder, at, encoded = MessageBuilder(names, options), 0, Encoded()
        if instructions:
            builder.system(instructions)
    else:
        builder, at, encoded = (
            MessageBuilder.resumed(resume, names, options),
            resume.count,
            resume.encoded,
        )
    n = len(items)
    while at < n:
        at = _plain_run(builder, items, at) if PLAIN_RUNS else at
        if at < n:
            builder.add(at, items[at])
            at += 1
    state = builder.snapshot(n, encoded) if keep else None
    builder.close()
    builder.flush_media()
    lead = builder.leading_system()
    if state is None and resume is None:
        return lead + builder.out
    encoded = state.encoded if state is not None else encoded
    return LoweredMessages(lead, len(lead), encoded, state, builder.out)


PLAIN_RUNS = True
"""Lower runs of plain tool-loop items in `_plain_run`; False: every item through
`MessageBuilder.add` (tests/test_plain_paths.py holds the two to the same output)."""


def _plain_run(b: MessageBuilder, items: list[dict[str, Any]], at: int) -> int:
    """Lower `items[at:]` while they are the two items a tool loop is made of, in their
    plain shapes (a function call with a call id and string arguments, its output as a
    string), as `MessageBuilder.add` would, without its lookups; returns the index of the first
    item it left to `add`. A 2,000-item history is a few such runs."""
    if b.media or b.reasoning:
        return at
    append, n = b.out.append, len(items)
    texts, calls = b.texts, b.calls  # the open assistant message (texts None: none open)
    flats: dict[tuple[Any, Any], str] = {}
    loads, JSONDecodeError = orjson.loads, orjson.JSONDecodeError
    while at < n:
        item = items[at]
        kind = item.get("type")
        if kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if output.__class__ is not str or not call_id or texts:
                break  # (an open message with text: `add` closes it)
            if texts is not None:
                if not calls:
                    break
                append({"role": "assistant", "content": None, "tool_calls": calls})
                texts, calls = None, []
            append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "function_call":
            arguments, call_id = item.get("arguments") or "", item.get("call_id")
            if not call_id or arguments.__class__ is not str:
                break
            key = (item.get("namespace") or None, item["name"])
            flat = flats.get(key)
            if flat is None:
                flat = flats[key] = b.names.encode(*key)
            if not arguments or arguments.isspace():
                arguments = "{}"  # vLLM parses replayed arguments as JSON
            else:
                try:
                    loads(arguments)
                except JSONDecodeError:  # cut off: `whole_arguments` says so in the text
                    b.texts, b.calls = [] if texts is None else texts, calls
                    arguments = b.whole_arguments(arguments, item)
                    texts = b.texts
            if texts is None:
                texts = []
            function = {"name": flat, "arguments": arguments}
            calls.append({"id": call_id, "type": "function", "function": function})
        else:
            break
        at += 1
    b.texts, b.calls = texts, calls
    return at


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
