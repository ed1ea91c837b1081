"""An open output item and what streams into it: parts, text deltas and their done events.

The grammar checker opens an `Item` per `output_item.added` and hands it the part, delta and
text-done events that refer to it; the item checks them (the `ref.*`, `part.*`, `delta.*` and
`done.mismatch` rules) and reports through the `flag(rule, message)` callable it is given, so
positions stay the checker's business.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamer.core.call_kinds import CALL_KINDS

Flag = Callable[[str, str], None]


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
    **{  # a call's arguments (function_call_arguments, custom_tool_call_input): its kind's
        row.events[0].removeprefix("response.").removesuffix(".delta"): Stream(
            row.call_type, None, None, row.field
        )
        for row in CALL_KINDS.values()
        if row.events is not None
    },
}
PART_EVENTS = {
    "response.content_part.added": ("content", True),
    "response.content_part.done": ("content", False),
    "response.reasoning_summary_part.added": ("summary", True),
    "response.reasoning_summary_part.done": ("summary", False),
}


def part_text(part: Any) -> str | None:
    """The text a content or summary part holds (`refusal` for refusals)."""
    if not isinstance(part, dict):
        return None
    value = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
    return value if isinstance(value, str) else None


def id_key(value: Any) -> Hashable:
    """An id as a dict key: a JSON list or object is not hashable, so it keys by its repr."""
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return value


def as_index(value: Any) -> int | None:
    """An output/content/summary index: a JSON integer (not a bool or a float), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


JSON_TYPES = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
}


def not_object(name: str, value: Any) -> str:
    """The message for a field that should hold an object (the `event.malformed` rule)."""
    if value is None:
        return f"no {name} object"
    return f"{name} is {JSON_TYPES.get(type(value), type(value).__name__)}, not an object"


def text_stream(kind: str) -> tuple[Stream, bool] | None:
    """The stream a `response.<stem>.delta|done` event writes, and whether it is the done."""
    stem, _, suffix = kind.removeprefix("response.").rpartition(".")
    stream = STREAMS.get(stem)
    if stream is None or suffix not in ("delta", "done"):
        return None
    return stream, suffix == "done"


@dataclass(slots=True)
class Part:
    type: str | None  # None: its added event had no part object
    chunks: list[str] = field(default_factory=list)
    open: bool = True
    text_done: bool = False
    annotations: int = 0  # annotation.added events seen


@dataclass(slots=True)
class Item:
    id: str | None
    type: str
    output_index: int
    call_id: str | None
    name: str | None
    namespace: str | None
    parts: dict[tuple[str, int], Part] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    args_streamed: bool = False
    args_done: bool = False

    def text(
        self, event: dict[str, Any], kind: str, stream: Stream, done: bool, flag: Flag
    ) -> None:
        """A text/arguments delta or done event on this item."""
        if self.type != stream.item_type:
            flag("ref.item_type", f"{kind} on a {self.type} item")
            return
        if stream.family is None:
            chunks, was_done = self.args, self.args_done
            self.args_streamed = True
            self.args_done = self.args_done or done
        else:
            part = self._part_for(event, stream.family, flag)
            if part is None:
                return
            if part.type is not None and part.type != stream.part_type:
                flag("ref.item_type", f"{kind} into a {part.type} part")
            chunks, was_done = part.chunks, part.text_done
            part.text_done = part.text_done or done
        if done:
            if event.get(stream.field) != "".join(chunks):
                flag("done.mismatch", f"{kind} {stream.field} differs from the deltas")
            return
        if was_done:
            flag("delta.after_done", f"{kind} after its .done")
        delta = event.get("delta")
        chunks.append(delta if isinstance(delta, str) else "")

    def part(self, event: dict[str, Any], kind: str, flag: Flag) -> None:
        """A content_part / reasoning_summary_part added or done event on this item."""
        family, added = PART_EVENTS[kind]
        raw = event.get("summary_index" if family == "summary" else "content_index")
        index = as_index(raw)
        given = event.get("part")
        ptype = str(given.get("type")) if isinstance(given, dict) else None
        if ptype is None:  # reported once here; an unknown type then matches any
            flag("event.malformed", f"{kind}: {not_object('part', given)}")
        if added:
            expected = sum(1 for f, _ in self.parts if f == family)
            if index != expected or (family, index) in self.parts:
                flag("part.index", f"{family} index {raw!r}, expected {expected}")
                if index is None or (family, index) in self.parts:
                    return
            self.parts[(family, index)] = Part(ptype)
            return
        part = self.parts.get((family, index)) if index is not None else None
        known = part is not None and None not in (part.type, ptype)
        if part is None or not part.open or (known and part.type != ptype):
            state = "not open" if part is None or not part.open else f"a {part.type} part"
            flag("part.unmatched", f"{kind} for {family} {raw!r} ({ptype}): {state}")
            return
        part.open = False
        if ptype is not None and part_text(given) != "".join(part.chunks):
            flag("done.mismatch", f"{kind} text differs from the concatenated deltas")

    def close(self, given: dict[str, Any] | None, flag: Flag) -> None:
        """At output_item.done: every part is done, and the item's texts equal the deltas.

        `given` is the done event's item, None when it was not an object (nothing to compare).
        """
        for (family, index), part in self.parts.items():
            if part.open:
                flag("part.not_done", f"{family} part {index} of {self.id!r} is open")
        if given is None:
            return
        if self.args_streamed:
            field_name = "input" if self.type == "custom_tool_call" else "arguments"
            if given.get(field_name) != "".join(self.args):
                flag("done.mismatch", f"item {field_name} differ from the concatenated deltas")
        for (family, index), part in self.parts.items():
            key = "summary" if family == "summary" else "content"
            parts = given.get(key)
            got = (
                part_text(parts[index])
                if isinstance(parts, list) and 0 <= index < len(parts)
                else None
            )
            if got != "".join(part.chunks):
                flag("done.mismatch", f"item {key}[{index}] differs from the concatenated deltas")

    def annotation(self, event: dict[str, Any], flag: Flag) -> None:
        """An `output_text.annotation.added` on this item: into an open output_text part,
        its `annotation_index` the next of that part's."""
        if self.type != "message":
            flag("ref.item_type", f"an annotation on a {self.type} item")
            return
        part = self._part_for(event, "content", flag)
        if part is None:
            return
        if part.type is not None and part.type != "output_text":
            flag("ref.item_type", f"an annotation on a {part.type} part")
        index = event.get("annotation_index")
        if as_index(index) != part.annotations:
            flag("annotation.index", f"annotation_index {index!r}, expected {part.annotations}")
        part.annotations += 1

    def _part_for(self, event: dict[str, Any], family: str, flag: Flag) -> Part | None:
        raw = event.get("summary_index" if family == "summary" else "content_index")
        index = as_index(raw)
        part = self.parts.get((family, index)) if index is not None else None
        if part is None or not part.open:
            state = "not added" if part is None else "already done"
            flag("ref.part", f"{family} index {raw!r} of {self.id!r} is {state}")
            return None
        return part


__all__ = [
    "PART_EVENTS",
    "STREAMS",
    "Item",
    "Part",
    "Stream",
    "as_index",
    "id_key",
    "not_object",
    "part_text",
    "text_stream",
]
