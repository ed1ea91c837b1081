"""The pieces `OutputItemStreamer` assembles output items from (pure).

Open parts, items and buffered tool calls, and the small conversions between the
backend's view of a call and the client's: public names, custom-tool input, tool-search
arguments, and the failure codes clients act on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import orjson

from streamer.core.client_tools import CLIENT_TOOLS
from streamer.core.events import Event
from streamer.core.json_bounds import MAX_ITEM_DEPTH, loads_within
from streamer.core.tools import ToolIdentity

_new = tuple.__new__  # Event's C-level constructor (see output.py)

# `error.code`s a client can act on: the spec's (`ResponseError.code`), plus the ones
# Codex classifies itself (context window, quota, plan).
FAILURE_CODES = frozenset(
    {
        "server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout",
        "invalid_image", "invalid_image_format", "invalid_base64_image", "invalid_image_url",
        "image_too_large", "image_too_small", "image_parse_error",
        "image_content_policy_violation", "invalid_image_mode", "image_file_too_large",
        "unsupported_image_media_type", "empty_image_file", "failed_to_download_image",
        "image_file_not_found", "context_length_exceeded", "insufficient_quota",
        "usage_not_included",
    }
)  # fmt: skip

# Finish reasons that end the response `incomplete`, and the reason they report.
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# The reason a response cut by the gateway's own output limits reports: the closest the
# spec has (the SDK's `incomplete_details.reason` is a closed set).
LIMIT_REASON = "max_output_tokens"


class OutputLimits:
    """What one backend answer may make a turn hold: characters of output, output items.

    Characters are counted as decoded (text, reasoning, refusal, tool call ids, names and
    arguments): what the gateway keeps in memory, and the size of the answer for ASCII.
    """

    __slots__ = ("max_chars", "max_items")

    def __init__(self, max_chars: int = 16 * 1024 * 1024, max_items: int = 2048) -> None:
        self.max_chars = max_chars
        self.max_items = max_items


class DeltaTemplate:
    """The one encoder of a delta event type on one item: `{...,"delta":…,"sequence_number":…}`.

    A delta event differs from the next only in `delta` and `sequence_number`, so the rest
    is encoded once, by orjson from the plain event dict, and each delta is one bytes format
    away (0.18 vs 1.32 µs for `orjson.dumps` of the whole dict; tests/test_delta_template.py
    checks the bytes against that dict's).
    """

    __slots__ = ("_prefix", "type")

    def __init__(self, event_type: str, where: dict[str, Any]) -> None:
        self.type = event_type
        # `{"type":…,<where>,"delta":0}` without its `0}`: the prefix as orjson writes it.
        self._prefix = orjson.dumps({"type": event_type, **where, "delta": 0})[:-2]

    def encode(self, delta: str, seq: int) -> bytes:
        """The event's JSON, with `sequence_number` last, as `orjson.dumps` of the dict."""
        return b'%s%s,"sequence_number":%d}' % (self._prefix, orjson.dumps(delta), seq)

    def run(self, raw: list[bytes], seq: int) -> list[Event]:
        """One event per piece of a run, numbered from `seq`: each piece's JSON string
        contents as the backend sent them (validated by the decoder, runs.py), spliced in
        where `encode` puts `orjson.dumps` of the decoded piece: the same JSON, parsed."""
        seqs = range(seq, seq + len(raw))
        prefix = self._prefix + b'"'
        datas = [
            b'%s%s","sequence_number":%d}' % (prefix, r, s) for r, s in zip(raw, seqs, strict=True)
        ]
        return list(map(_new, repeat(Event), zip(repeat(self.type), datas, seqs)))


class Part:
    """The open content part of a message or reasoning item."""

    __slots__ = ("delta", "index", "kind", "logprobs", "text", "where")

    def __init__(
        self, kind: str, index: int, delta_type: str, item_id: str, output_index: int
    ) -> None:
        self.kind = kind  # output_text | refusal | reasoning_text | summary_text
        self.index = index
        self.where: dict[str, Any] = {
            "item_id": item_id,
            "output_index": output_index,
            ("summary_index" if kind == "summary_text" else "content_index"): index,
        }
        self.logprobs: list[dict[str, Any]] = []  # the tokens' logprobs, when asked for
        where = {**self.where, "logprobs": []} if kind == "output_text" else self.where
        self.delta = DeltaTemplate(delta_type, where)
        self.text = TextBuffer()


class TextBuffer:
    """The text of a part so far, compact while thousands of small deltas arrive.

    A list of the deltas (or a StringIO, which keeps them the same way until read)
    costs ~60 bytes of object per delta and holds them all: 126 kB for a 15 kB answer of
    2,000 deltas, with many streams open at once. Here the recent deltas wait in
    `pieces`, joined into one string each time there are `JOIN` of them: ~17 kB for that
    answer, each character copied once.
    """

    __slots__ = ("_joined", "pieces")
    JOIN = 64

    def __init__(self) -> None:
        self._joined: list[str] = []
        self.pieces: list[str] = []

    def write(self, text: str) -> None:
        pieces = self.pieces
        pieces.append(text)
        if len(pieces) >= self.JOIN:
            self._joined.append("".join(pieces))
            pieces.clear()

    def getvalue(self) -> str:
        return "".join(self._joined + self.pieces)


class Item:
    """The open message or reasoning item."""

    __slots__ = ("id", "item", "output_index", "part")

    def __init__(self, item: dict[str, Any], output_index: int) -> None:
        self.item = item
        self.id: str = item["id"]
        self.output_index = output_index
        self.part: Part | None = None


class Call:
    """One backend tool call, accumulated by its backend index."""

    __slots__ = ("args", "call_id", "delta", "emitted", "index", "item", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.call_id: str | None = None
        self.name = ""
        self.args: list[str] = []
        self.item: dict[str, Any] | None = None  # set once output_item.added went out
        self.delta: DeltaTemplate | None = None  # set while its arguments stream live
        self.emitted = False  # output_item.done went out


def public_name(identity: ToolIdentity) -> dict[str, str]:
    """`name`, plus `namespace` for namespaced identities: what Codex routes on."""
    if identity.namespace is None:
        return {"name": identity.name}
    return {"name": identity.name, "namespace": identity.namespace}


def empty_part(kind: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    if kind == "refusal":
        return {"type": "refusal", "refusal": ""}
    return {"type": kind, "text": ""}  # reasoning_text, summary_text


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


def new_item(item_type: str, make_id: Callable[[str], str]) -> dict[str, Any]:
    """A message or reasoning item as `output_item.added` shows it."""
    if item_type == "message":
        return {
            "id": make_id("msg"),
            "type": "message",
            "status": "in_progress",
            "content": [],
            "role": "assistant",
        }
    return {
        "id": make_id("rs"),
        "type": "reasoning",
        "status": "in_progress",
        "summary": [],
        "content": [],
    }


def new_call_item(
    identity: ToolIdentity,
    call_id: str,
    make_id: Callable[[str], str],
    args: Sequence[str] = (),
) -> dict[str, Any]:
    """The output item for a call, by the kind of tool its flat name decodes to. A shell or
    apply_patch call is added whole (it never streams live): `args` are its arguments."""
    item: dict[str, Any]
    client = CLIENT_TOOLS.get(identity.kind)
    if client is not None:
        item = {"id": make_id(client.id_prefix), "type": client.call_type}
        item.update(status="in_progress", call_id=call_id, **client.call_fields("".join(args)))
    elif identity.kind == "custom":
        item = {"id": make_id("ctc"), "type": "custom_tool_call", "status": "in_progress"}
        item.update(call_id=call_id, input="", **public_name(identity))
    elif identity.kind == "tool_search":
        item = {"id": make_id("tsc"), "type": "tool_search_call", "status": "in_progress"}
        item.update(call_id=call_id, execution="client", arguments={})
    elif identity.kind == "local_shell":
        item = {"id": make_id("lsh"), "type": "local_shell_call", "status": "in_progress"}
        item.update(call_id=call_id, action={"type": "exec", "command": [], "env": {}})
    else:
        item = {"id": make_id("fc"), "type": "function_call", "status": "in_progress"}
        item.update(arguments="", call_id=call_id, **public_name(identity))
    return item


def part_done(
    kind: str, text: str, logprobs: list[dict[str, Any]] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished part's `*.done` event (without its location) and the part itself;
    an output_text part carries its tokens' `logprobs` (the done event and the part alike,
    `bytes` included: Open Responses requires them; the SDK's event type ignores them)."""
    if kind == "output_text":
        entries = logprobs or []
        done = {"type": "response.output_text.done", "text": text, "logprobs": entries}
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": entries}
        return done, part
    if kind == "refusal":
        return {"type": "response.refusal.done", "refusal": text}, {
            "type": "refusal",
            "refusal": text,
        }
    if kind == "summary_text":
        return {"type": "response.reasoning_summary_text.done", "text": text}, {
            "type": "summary_text",
            "text": text,
        }
    return {"type": "response.reasoning_text.done", "text": text}, {
        "type": "reasoning_text",
        "text": text,
    }


SUMMARIES = ("auto", "concise", "detailed")
"""`reasoning.summary` values that ask for the reasoning as `summary_text` parts."""


def wants_summary(response: dict[str, Any]) -> bool:
    """Whether the request (as the Response echoes it) asked for reasoning summaries."""
    reasoning = response.get("reasoning")
    return isinstance(reasoning, dict) and reasoning.get("summary") in SUMMARIES
