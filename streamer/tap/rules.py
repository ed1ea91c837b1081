"""The grammar's rule catalogue and the violation record it reports (pure data).

Each rule id is stable: tests and CI jobs match violations by `rule` and `position`.
"""

from __future__ import annotations

from dataclasses import dataclass

RULES: dict[str, str] = {
    "event.malformed": (
        "a frame that is not a JSON object with a string `type`, "
        "or an event whose `item` or `part` is not an object"
    ),
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
    "annotation.index": "annotation_index rises by one from 0 within a content part",
    "ref.passthrough": (
        "an event the grammar does not know that names an item (item_id) names one added "
        "before it, at that item's output_index"
    ),
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


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule, at the 0-based position of the event that broke it."""

    position: int
    rule: str
    message: str


__all__ = ["RULES", "Violation"]
