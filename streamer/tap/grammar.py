"""The Responses stream grammar, checked one event at a time (pure, no I/O).

`GrammarChecker.feed(event)` returns the violations that event causes, `finish()` those the
end of the stream causes. Each violation carries a stable `rule` id (see RULES) and the
0-based position of the event in the stream, so a test or a CI job can match them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from streamer.tools import ResponsesToolNames

RULES: dict[str, str] = {
    "event.malformed": "a frame that is not a JSON object with a string `type`",
    "sequence.start": "sequence_number starts at 0",
    "sequence.step": "sequence_number rises by one",
    "sequence.missing": "every Responses event carries sequence_number (`error` may omit it)",
    "stream_id.changed": "stream_id is constant within a stream",
    "first_event": "the first event is response.created or response.queued (or error)",
    "lifecycle.duplicate": "response.created / response.queued appear at most once",
    "response.id_changed": "every lifecycle event carries the same response id",
    "item.id_missing": "output_item.added carries an item with an id",
    "item.output_index": "output_index rises by one from 0, one per added item",
    "item.added_while_open": "no item is added while another is open",
    "item.done_unmatched": "output_item.done closes the open item (same id, type, index)",
    "item.not_done": "every added item is done before response.completed/incomplete",
    "ref.item": "a delta, part or text event refers to the open item",
    "ref.item_type": "a delta suits its item's type",
    "ref.part": "a text delta or done refers to an open content part / summary index",
    "part.index": "content_index / summary_index rise by one from 0 within an item",
    "part.unmatched": "a part's done matches its added (index, type) while open",
    "part.not_done": "every content part / summary part is done before its item",
    "delta.after_done": "no delta after its text/arguments done event",
    "done.mismatch": "done texts, arguments and inputs equal the concatenated deltas",
    "call.id_missing": "function and custom tool calls carry a call_id",
    "call.id_changed": "a call's call_id is the same on added, done and the terminal output",
    "call.id_duplicate": "call ids are unique within a response",
    "call.identity_changed": "a call's name and namespace agree on added, done and terminal",
    "tool.flat_name": "a call does not carry a flat backend name of a namespaced tool",
    "tool.namespace_missing": "a call to a namespace member carries `namespace`",
    "tool.undeclared": "a call's (namespace, name) is a declared tool",
    "tool.kind": "a call's item type matches its tool's kind (function/custom)",
    "terminal.status": "the terminal event's response.status matches its type",
    "terminal.trailing": "exactly one terminal event, and nothing after it",
    "terminal.missing": "the stream ends with a terminal event (or error)",
    "terminal.output": "the terminal output equals the items done (ids, types, call ids)",
}

TERMINALS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
STARTS = ("response.created", "response.queued")
CALL_KINDS = {"function_call": "function", "custom_tool_call": "custom"}
CALL_TYPES = tuple(CALL_KINDS)
DEFAULT_NAMESPACES = (None, "", "functions")  # Codex routes these as "no namespace"


class Stream(NamedTuple):
    """A streamed text: `response.<stem>.delta` events, then `response.<stem>.done`."""

    item_type: str
    family: str | None  # the part index it writes into ("content", "summary"), or the item
    part_type: str | None
    field: str  # the full text's field on the .done event


STREAMS: dict[str, Stream] = {
    "output_text": Stream("message", "content", "output_text", "text"),
    "refusal": Stream("message", "content", "refusal", "refusal"),
    "reasoning_text": Stream("reasoning", "content", "reasoning_text", "text"),
    "reasoning_summary_text": Stream("reasoning", "summary", "summary_text", "text"),
    "function_call_arguments": Stream("function_call", None, None, "arguments"),
    "custom_tool_call_input": Stream("custom_tool_call", None, None, "input"),
}
PART_EVENTS = {
    "response.content_part.added": ("content", True),
    "response.content_part.done": ("content", False),
    "response.reasoning_summary_part.added": ("summary", True),
    "response.reasoning_summary_part.done": ("summary", False),
}


@dataclass(frozen=True, slots=True)
class Violation:
    position: int
    rule: str
    message: str


@dataclass(slots=True)
class _Part:
    type: str
    chunks: list[str] = field(default_factory=list)
    open: bool = True
    text_done: bool = False


@dataclass(slots=True)
class _Item:
    id: str | None
    type: str
    output_index: int
    call_id: str | None
    name: str | None
    namespace: str | None
    parts: dict[tuple[str, int], _Part] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    args_streamed: bool = False
    args_done: bool = False


def part_text(part: Any) -> str | None:
    """The text a content or summary part holds (`refusal` for refusals)."""
    if not isinstance(part, dict):
        return None
    value = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
    return value if isinstance(value, str) else None


def is_responses_type(kind: str) -> bool:
    """Responses events (checked) versus vendor passthrough events such as codex.*."""
    return kind.startswith("response.") or kind == "error"


def default_ns(namespace: Any) -> Any:
    return None if namespace in DEFAULT_NAMESPACES else namespace


class ToolCheck:
    """A call's (namespace, name) against the tools a request declared (a ResponsesToolNames)."""

    def __init__(self, names: ResponsesToolNames) -> None:
        self.names = names
        self.declared: dict[tuple[Any, str], str] = {}
        for tool in names.tools:
            ident = tool.identity
            self.declared[(default_ns(ident.namespace), ident.name)] = ident.kind
        self.members = {name for ns, name in self.declared if ns is not None}

    def check(self, item_type: str, name: Any, namespace: Any) -> tuple[str, str] | None:
        """A (rule, message) pair when the call surface is wrong, else None."""
        if not isinstance(name, str):
            return None
        ns = default_ns(namespace)
        kind = self.declared.get((ns, name))
        if kind is None:
            if ns is not None:
                return "tool.undeclared", f"{namespace}/{name} is not a declared tool"
            ident = self.names.decode(name)
            if default_ns(ident.namespace) is not None:
                return (
                    "tool.flat_name",
                    f"{name!r} is the flat name of {ident.namespace}/{ident.name}: the call "
                    "must carry namespace and the bare name",
                )
            if name in self.members:
                return "tool.namespace_missing", f"{name!r} is a namespace member: no namespace"
            return None  # an undeclared top-level name: passed through, not ours to judge
        if kind != CALL_KINDS.get(item_type):
            return "tool.kind", f"a {item_type} to a {kind} tool {name!r}"
        return None


class GrammarChecker:
    """Checks one Responses stream against the grammar of the wire notes (§6, §7.3).

    With `session=True` (a WebSocket frame log), a new response may start after a terminal
    event: a response.created/queued or an `error` then resets the per-response state.
    """

    def __init__(self, names: ResponsesToolNames | None = None, *, session: bool = False) -> None:
        self.tools = ToolCheck(names) if names is not None else None
        self.session = session
        self.position = -1
        self._out: list[Violation] = []
        self._reset()

    @property
    def names(self) -> ResponsesToolNames | None:
        return self.tools.names if self.tools else None

    @names.setter
    def names(self, names: ResponsesToolNames | None) -> None:
        self.tools = ToolCheck(names) if names is not None else None

    def _reset(self) -> None:
        self.expected_seq: int | None = None
        self._stream_id: Any = None
        self.started = False
        self.created = False
        self.seen_responses_event = False
        self.response_id: str | None = None
        self.terminal: str | None = None
        self.open: dict[Any, _Item] = {}  # by item id; more than one only after a violation
        self.done_items: list[_Item] = []
        self.added_count = 0
        self.call_ids: set[str] = set()
        self.tool_checked: set[tuple[int, str | None, str | None]] = set()

    # -- public ------------------------------------------------------------------------------

    def feed(self, event: Any) -> list[Violation]:
        self.position += 1
        self._out = []
        self._feed(event)
        return self._out

    def _feed(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self._flag("event.malformed", "not a JSON object with a string `type`")
            if self.expected_seq is not None:
                self.expected_seq += 1
            return
        kind: str = event["type"]
        if self.terminal is not None:
            if self.session and (kind in STARTS or kind == "error"):
                self._reset()
            elif self.session and not is_responses_type(kind):
                return
            else:
                self._flag("terminal.trailing", f"{kind} after {self.terminal}")
                return
        self._check_sequence(event, kind)
        self._check_stream_id(event)
        if not is_responses_type(kind):
            return
        if not self.seen_responses_event:
            self.seen_responses_event = True
            if kind not in STARTS and kind != "error":
                self._flag("first_event", f"stream starts with {kind}")
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        elif kind in PART_EVENTS:
            self._on_part(event, kind)
        else:
            stem, _, suffix = kind.removeprefix("response.").rpartition(".")
            stream = STREAMS.get(stem)
            if stream is not None and suffix in ("delta", "done"):
                self._on_text(event, kind, stream, suffix == "done")

    def finish(self) -> list[Violation]:
        """End-of-stream checks; positions point one past the last event."""
        if self.terminal is None:
            end = self.position + 1
            what = "the stream is empty" if end == 0 else "the stream ended"
            return [Violation(end, "terminal.missing", f"{what} without a terminal event")]
        return []

    # -- helpers -----------------------------------------------------------------------------

    def _flag(self, rule: str, message: str) -> None:
        self._out.append(Violation(self.position, rule, message))

    def _check_sequence(self, event: dict[str, Any], kind: str) -> None:
        seq = event.get("sequence_number")
        if not isinstance(seq, int) or isinstance(seq, bool):
            if kind.startswith("response."):
                self._flag("sequence.missing", f"{kind} has no integer sequence_number")
                if self.expected_seq is not None:
                    self.expected_seq += 1
            return
        if self.expected_seq is None:
            if seq != 0:
                self._flag("sequence.start", f"first sequence_number is {seq}, not 0")
        elif seq != self.expected_seq:
            self._flag("sequence.step", f"sequence_number {seq}, expected {self.expected_seq}")
        self.expected_seq = seq + 1  # resynchronise so one gap is reported once

    def _check_stream_id(self, event: dict[str, Any]) -> None:
        sid = event.get("stream_id")
        if self._stream_id is None:
            self._stream_id = sid
        elif sid != self._stream_id:
            self._flag("stream_id.changed", f"stream_id {sid!r}, was {self._stream_id!r}")

    def _open_item(self, event: dict[str, Any]) -> _Item | None:
        """The open item an event refers to by `item_id`, or None (a ref.item violation)."""
        item_id, index = event.get("item_id"), event.get("output_index")
        item = self.open.get(item_id)
        if item is None:
            opened = ", ".join(repr(i) for i in self.open) or "none"
            self._flag("ref.item", f"refers to item {item_id!r}; open items: {opened}")
        elif index != item.output_index:
            # the id is authoritative: keep following the item, report the index once here
            self._flag("ref.item", f"output_index {index!r} for {item_id!r} at {item.output_index}")
        return item

    # -- lifecycle ---------------------------------------------------------------------------

    def _on_start(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        # queued may precede created (background mode); nothing else repeats
        if self.created or (kind == "response.queued" and self.started):
            self._flag("lifecycle.duplicate", f"a second {kind}")
        self.started = True
        self.created = self.created or kind == "response.created"
        self._check_response_id(event)

    def _check_response_id(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        rid = response.get("id") if isinstance(response, dict) else None
        if rid is None:
            return
        if self.response_id is None:
            self.response_id = rid
        elif rid != self.response_id:
            self._flag("response.id_changed", f"response id {rid!r}, was {self.response_id!r}")

    def _on_terminal(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        self.terminal = kind
        if kind == "error":
            return
        self._check_response_id(event)
        response = event.get("response")
        response = response if isinstance(response, dict) else {}
        status = response.get("status")
        if status != TERMINALS[kind]:
            self._flag("terminal.status", f"{kind} with response.status {status!r}")
        if kind != "response.failed":
            for item in self.open.values():
                self._flag("item.not_done", f"item {item.id!r} is still open at {kind}")
        output = response.get("output")
        if isinstance(output, list):
            self._check_terminal_output(output, kind == "response.failed")
        elif "output" in response or kind != "response.failed":
            self._flag("terminal.output", "the terminal response has no output list")

    def _check_terminal_output(self, output: list[Any], failed: bool) -> None:
        # items left open were reported as item.not_done; they may still be listed
        done = self.done_items + sorted(self.open.values(), key=lambda i: i.output_index)
        if failed:
            # a failure may list, drop or keep in progress the items streamed so far
            by_id = {i.id: i for i in done}
            pairs = [(by_id.get(o.get("id")), o) for o in output if isinstance(o, dict)]
            pairs = [(i, o) for i, o in pairs if i is not None]
        else:
            if len(output) != len(done):
                self._flag(
                    "terminal.output", f"output has {len(output)} items, {len(done)} were done"
                )
            pairs = list(zip(done, output, strict=False))
        for item, given in pairs:
            if not isinstance(given, dict):
                self._flag("terminal.output", f"output[{item.output_index}] is not an object")
                continue
            if (given.get("id"), given.get("type")) != (item.id, item.type):
                self._flag(
                    "terminal.output",
                    f"output[{item.output_index}] is {given.get('type')} {given.get('id')!r}, "
                    f"the item done was {item.type} {item.id!r}",
                )
                continue
            self._check_call_surface(item, given, "the terminal output")

    # -- items -------------------------------------------------------------------------------

    def _on_item_added(self, event: dict[str, Any]) -> None:
        given = event.get("item")
        given = given if isinstance(given, dict) else {}
        index = event.get("output_index")
        if self.open:
            opened = ", ".join(repr(i) for i in self.open)
            self._flag(
                "item.added_while_open", f"item {given.get('id')!r} added while {opened} open"
            )
        if index != self.added_count:
            self._flag("item.output_index", f"output_index {index!r}, expected {self.added_count}")
        self.added_count += 1
        if not given.get("id"):
            self._flag("item.id_missing", f"a {given.get('type')} item without an id")
        item = _Item(
            id=given.get("id"),
            type=str(given.get("type")),
            output_index=index if isinstance(index, int) else -1,
            call_id=given.get("call_id"),
            name=given.get("name"),
            namespace=given.get("namespace"),
        )
        self.open[item.id] = item
        if item.type in CALL_TYPES:
            if not item.call_id:
                self._flag("call.id_missing", f"{item.type} {item.id!r} has no call_id")
            elif item.call_id in self.call_ids:
                self._flag("call.id_duplicate", f"call_id {item.call_id!r} used twice")
            else:
                self.call_ids.add(item.call_id)
            self._check_tool(item, item.name, item.namespace)

    def _on_item_done(self, event: dict[str, Any]) -> None:
        given = event.get("item")
        given = given if isinstance(given, dict) else {}
        key = (given.get("id"), given.get("type"), event.get("output_index"))
        item = self.open.get(key[0])
        if item is None and len(self.open) == 1:
            item = next(iter(self.open.values()))  # a wrong id still closes the one open item
        if item is None or key != (item.id, item.type, item.output_index):
            where = f"the open item is {item.type} {item.id!r}" if item else "no such item is open"
            self._flag(
                "item.done_unmatched", f"done for {key[1]} {key[0]!r} at {key[2]!r}; {where}"
            )
            if item is None:
                return
        for (family, index), part in item.parts.items():
            if part.open:
                self._flag("part.not_done", f"{family} part {index} of {item.id!r} is open")
        self._check_item_texts(item, given)
        self._check_call_surface(item, given, "output_item.done")
        self.done_items.append(item)
        del self.open[item.id]

    def _check_item_texts(self, item: _Item, given: dict[str, Any]) -> None:
        if item.args_streamed:
            field_name = "arguments" if item.type == "function_call" else "input"
            if given.get(field_name) != "".join(item.args):
                self._flag(
                    "done.mismatch", f"item {field_name} differ from the concatenated deltas"
                )
        for (family, index), part in item.parts.items():
            key = "summary" if family == "summary" else "content"
            parts = given.get(key)
            got = (
                part_text(parts[index]) if isinstance(parts, list) and index < len(parts) else None
            )
            if got != "".join(part.chunks):
                self._flag(
                    "done.mismatch", f"item {key}[{index}] differs from the concatenated deltas"
                )

    def _check_call_surface(self, item: _Item, given: dict[str, Any], where: str) -> None:
        if item.type not in CALL_TYPES:
            return
        if given.get("call_id") != item.call_id:
            self._flag(
                "call.id_changed",
                f"{where} call_id {given.get('call_id')!r}, added {item.call_id!r}",
            )
        name, namespace = given.get("name"), given.get("namespace")
        tool_ok = self._check_tool(item, name, namespace)
        if tool_ok and (name, namespace) != (item.name, item.namespace):
            self._flag(
                "call.identity_changed",
                f"{where} has name {name!r} namespace {namespace!r}; added had "
                f"{item.name!r} {item.namespace!r}",
            )

    def _check_tool(self, item: _Item, name: Any, namespace: Any) -> bool:
        """Declared-tool checks (only with `names`), each distinct surface value once."""
        if self.tools is None:
            return True
        key = (item.output_index, name, namespace)
        if key in self.tool_checked:
            return True
        self.tool_checked.add(key)
        found = self.tools.check(item.type, name, namespace)
        if found is None:
            return True
        self._flag(*found)
        return False

    # -- deltas and parts --------------------------------------------------------------------

    def _part_for(self, item: _Item, event: dict[str, Any], family: str) -> _Part | None:
        index = event.get("summary_index" if family == "summary" else "content_index")
        part = item.parts.get((family, index)) if isinstance(index, int) else None
        if part is None or not part.open:
            state = "not added" if part is None else "already done"
            self._flag("ref.part", f"{family} index {index!r} of {item.id!r} is {state}")
            return None
        return part

    def _on_text(self, event: dict[str, Any], kind: str, stream: Stream, done: bool) -> None:
        item = self._open_item(event)
        if item is None:
            return
        if item.type != stream.item_type:
            self._flag("ref.item_type", f"{kind} on a {item.type} item")
            return
        if stream.family is None:
            chunks, was_done = item.args, item.args_done
            item.args_streamed = True
            item.args_done = item.args_done or done
        else:
            part = self._part_for(item, event, stream.family)
            if part is None:
                return
            if part.type != stream.part_type:
                self._flag("ref.item_type", f"{kind} into a {part.type} part")
            chunks, was_done = part.chunks, part.text_done
            part.text_done = part.text_done or done
        if done:
            if event.get(stream.field) != "".join(chunks):
                self._flag("done.mismatch", f"{kind} {stream.field} differs from the deltas")
            return
        if was_done:
            self._flag("delta.after_done", f"{kind} after its .done")
        delta = event.get("delta")
        chunks.append(delta if isinstance(delta, str) else "")

    def _on_part(self, event: dict[str, Any], kind: str) -> None:
        family, added = PART_EVENTS[kind]
        item = self._open_item(event)
        if item is None:
            return
        index = event.get("summary_index" if family == "summary" else "content_index")
        ptype = str((event.get("part") or {}).get("type"))
        if added:
            expected = sum(1 for f, _ in item.parts if f == family)
            if index != expected or (family, index) in item.parts:
                self._flag("part.index", f"{family} index {index!r}, expected {expected}")
                if (family, index) in item.parts:
                    return
            item.parts[(family, index)] = _Part(ptype)  # type: ignore[index]
            return
        part = item.parts.get((family, index)) if isinstance(index, int) else None
        if part is None or not part.open or part.type != ptype:
            state = "not open" if part is None or not part.open else f"a {part.type} part"
            self._flag("part.unmatched", f"{kind} for {family} {index!r} ({ptype}): {state}")
            return
        part.open = False
        if part_text(event.get("part")) != "".join(part.chunks):
            self._flag("done.mismatch", f"{kind} text differs from the concatenated deltas")


_HANDLERS = {
    "response.created": GrammarChecker._on_start,
    "response.queued": GrammarChecker._on_start,
    "response.in_progress": GrammarChecker._check_response_id,
    "response.output_item.added": GrammarChecker._on_item_added,
    "response.output_item.done": GrammarChecker._on_item_done,
    "error": GrammarChecker._on_terminal,
    **dict.fromkeys(TERMINALS, GrammarChecker._on_terminal),
}

__all__ = ["RULES", "GrammarChecker", "ToolCheck", "Violation", "default_ns", "part_text"]
