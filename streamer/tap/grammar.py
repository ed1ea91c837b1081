"""The Responses stream grammar, checked one event at a time (pure, no I/O).

`GrammarChecker.feed(event)` returns the violations that event causes, `finish()` those the
end of the stream causes. Each violation carries a stable `rule` id (see RULES) and the
0-based position of the event in the stream, so a test or a CI job can match them exactly.

The checker follows the stream: sequence numbers, the response lifecycle, items opening and
closing, call ids and tool identities, the terminal event. What streams into an open item is
checked by `items.Item`; which tools a call may name, by `identity.ToolCheck`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from streamer.core.events import TERMINAL_STATUSES
from streamer.tap.identity import CALL_TYPES, ToolCheck, default_ns
from streamer.tap.items import (
    PART_EVENTS,
    Item,
    as_index,
    id_key,
    not_object,
    part_text,
    text_stream,
)
from streamer.tap.rules import RULES, Violation

if TYPE_CHECKING:
    from streamer.core.tools import ResponsesToolNames

STARTS = ("response.created", "response.queued")
ANNOTATION = "response.output_text.annotation.added"


def is_responses_type(kind: str) -> bool:
    """Responses events (checked) versus vendor passthrough events such as codex.*."""
    return kind.startswith("response.") or kind == "error"


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
        # by id_key(item id); more than one only after a violation
        self.open: dict[Hashable, Item] = {}
        self.done_items: list[Item] = []
        self.added_count = 0
        self.call_ids: set[str] = set()
        self.tool_checked: set[tuple[int, Hashable, Hashable]] = set()

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
            return
        text = text_stream(kind)
        if kind == ANNOTATION:
            item = self._open_item(event)
            if item is not None:
                item.annotation(event, self._flag)
            return
        if kind not in PART_EVENTS and text is None:
            if "item_id" in event:  # a pass-through event (a hosted call's progress, ...)
                self._check_passthrough(event, kind)
            return  # else a Responses event the grammar says nothing about
        item = self._open_item(event)
        if item is None:
            return
        if text is None:
            item.part(event, kind, self._flag)
        else:
            item.text(event, kind, *text, self._flag)

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

    def _check_passthrough(self, event: dict[str, Any], kind: str) -> None:
        """An event that names an item names one the stream added (open or done)."""
        item_id = event.get("item_id")
        known = self.open.get(id_key(item_id))
        if known is None:
            known = next((i for i in self.done_items if id_key(i.id) == id_key(item_id)), None)
        if known is None:
            self._flag("ref.passthrough", f"{kind} names item {item_id!r}, never added")
        elif as_index(event.get("output_index")) != known.output_index:
            self._flag(
                "ref.passthrough",
                f"{kind} has output_index {event.get('output_index')!r} for {item_id!r} "
                f"at {known.output_index}",
            )

    def _open_item(self, event: dict[str, Any]) -> Item | None:
        """The open item an event refers to by `item_id`, or None (a ref.item violation)."""
        item_id, index = event.get("item_id"), event.get("output_index")
        item = self.open.get(id_key(item_id))
        if item is None:
            opened = ", ".join(repr(i.id) for i in self.open.values()) or "none"
            self._flag("ref.item", f"refers to item {item_id!r}; open items: {opened}")
        elif as_index(index) != item.output_index:
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
        if status not in TERMINAL_STATUSES[kind]:
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
            by_id = {id_key(i.id): i for i in done}
            pairs = [
                (found, o)
                for o in output
                if isinstance(o, dict) and (found := by_id.get(id_key(o.get("id")))) is not None
            ]
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
        raw = event.get("item")
        given = raw if isinstance(raw, dict) else {}
        index = event.get("output_index")
        position = as_index(index)
        if self.open:
            opened = ", ".join(repr(i.id) for i in self.open.values())
            self._flag(
                "item.added_while_open", f"item {given.get('id')!r} added while {opened} open"
            )
        if position != self.added_count:
            self._flag("item.output_index", f"output_index {index!r}, expected {self.added_count}")
        self.added_count += 1
        if not isinstance(raw, dict):
            self._flag("event.malformed", f"output_item.added: {not_object('item', raw)}")
        elif not given.get("id"):
            self._flag("item.id_missing", f"a {given.get('type')} item without an id")
        elif not isinstance(given["id"], str):
            self._flag("item.id_missing", f"a {given.get('type')} item with id {given['id']!r}")
        item = Item(
            id=given.get("id"),
            type=str(given.get("type")),
            output_index=-1 if position is None else position,
            call_id=given.get("call_id"),
            name=given.get("name"),
            namespace=given.get("namespace"),
        )
        self.open[id_key(item.id)] = item
        if item.type in CALL_TYPES:
            if not item.call_id or not isinstance(item.call_id, str):
                what = f"call_id {item.call_id!r}" if item.call_id else "no call_id"
                self._flag("call.id_missing", f"{item.type} {item.id!r} has {what}")
            elif item.call_id in self.call_ids:
                self._flag("call.id_duplicate", f"call_id {item.call_id!r} used twice")
            else:
                self.call_ids.add(item.call_id)
            self._check_tool(item, item.name, item.namespace)

    def _on_item_done(self, event: dict[str, Any]) -> None:
        raw = event.get("item")
        given = raw if isinstance(raw, dict) else None
        key = (given or {}).get("id"), (given or {}).get("type"), event.get("output_index")
        item = self.open.get(id_key(key[0])) if given is not None else None
        if item is None and len(self.open) == 1:
            item = next(iter(self.open.values()))  # a wrong id still closes the one open item
        if given is None:
            self._flag("event.malformed", f"output_item.done: {not_object('item', raw)}")
        elif (
            item is None or as_index(key[2]) != item.output_index or key[:2] != (item.id, item.type)
        ):
            where = f"the open item is {item.type} {item.id!r}" if item else "no such item is open"
            self._flag(
                "item.done_unmatched", f"done for {key[1]} {key[0]!r} at {key[2]!r}; {where}"
            )
        if item is None:
            return
        item.close(given, self._flag)
        if given is not None:
            self._check_call_surface(item, given, "output_item.done")
        self.done_items.append(item)
        del self.open[id_key(item.id)]

    def _check_call_surface(self, item: Item, given: dict[str, Any], where: str) -> None:
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

    def _check_tool(self, item: Item, name: Any, namespace: Any) -> bool:
        """Declared-tool checks (only with `names`), each distinct surface value once."""
        if self.tools is None:
            return True
        key = (item.output_index, id_key(name), id_key(namespace))
        if key in self.tool_checked:
            return True
        self.tool_checked.add(key)
        found = self.tools.check(item.type, name, namespace)
        if found is None:
            return True
        self._flag(*found)
        return False


_HANDLERS = {
    "response.created": GrammarChecker._on_start,
    "response.queued": GrammarChecker._on_start,
    "response.in_progress": GrammarChecker._check_response_id,
    "response.output_item.added": GrammarChecker._on_item_added,
    "response.output_item.done": GrammarChecker._on_item_done,
    "error": GrammarChecker._on_terminal,
    **dict.fromkeys(TERMINAL_STATUSES, GrammarChecker._on_terminal),
}

# RULES, ToolCheck, default_ns and part_text live elsewhere now; callers still import them here
__all__ = ["RULES", "GrammarChecker", "ToolCheck", "Violation", "default_ns", "part_text"]
