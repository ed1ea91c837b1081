"""How a tapped stream is shown: a timeline for people, or JSON lines for programs.

Three modes share one `Renderer`:
- `timeline` (default): one line per output item (its deltas collapsed into their text, with
  counts), lifecycle and other events on their own lines, violations under the line where
  they occur; a Chat Completions stream collapses runs of text and each tool call the same way;
- `follow`: one line per event, printed as it arrives;
- `json`: one object per event `{position, t, type, event, identity, violations}`, then one
  `{"summary": {...}}` object.
All end with a summary (`summary`): items, calls by identity, tokens, timing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from streamer.core import deltas as d
from streamer.core.events import STREAM_END_TYPES
from streamer.tap.identity import identity, label
from streamer.tap.items import id_key, part_text
from streamer.tap.rules import Violation
from streamer.tap.sources import ChatDone
from streamer.tap.summary import Summary, ms, rows

COLORS = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34"}
COLORS |= {"magenta": "35", "cyan": "36"}
STATUS_COLOR = {"completed": "green", "incomplete": "yellow", "failed": "red"}
PART_ADDED = ("response.content_part.added", "response.reasoning_summary_part.added")
CHAT_TYPES = {
    d.TextDelta: "chat.text",
    d.LoggedText: "chat.text",
    d.ReasoningDelta: "chat.reasoning",
    d.RefusalDelta: "chat.refusal",
    d.ToolCallDelta: "chat.tool_call",
    d.Finish: "chat.finish",
    d.Usage: "chat.usage",
    d.UpstreamError: "chat.error",
}


def _dict(value: Any) -> dict[str, Any]:
    """`value` if it is an object, else an empty one (events from a file may be anything)."""
    return value if isinstance(value, dict) else {}


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def quote(text: str, limit: int = 80) -> str:
    short = orjson.dumps(text[:limit]).decode()
    return short + "…" if len(text) > limit else short


def raw_json(text: str, limit: int = 100) -> str:
    """Arguments are JSON already: shown as they are, on one line."""
    text = text.replace("\n", " ")
    return text[:limit] + "…" if len(text) > limit else text


@dataclass(slots=True)
class _Run:
    """Events collapsed into one timeline line: an output item, or a run of chat deltas."""

    first: int
    t: float
    since: float | None  # the previous event's time, for the gap column
    item: dict[str, Any] = field(default_factory=dict)
    ident: dict[str, Any] | None = None
    parts: dict[tuple[str, Any], list[str]] = field(default_factory=dict)  # by (family, index)
    part_types: dict[tuple[str, Any], str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    key: Any = None  # chat: the delta kind, or ("tool_call", index)


class Renderer:
    def __init__(
        self, out: TextIO, *, mode: str = "timeline", color: bool = False, names: Any = None
    ) -> None:
        self.out, self.mode, self.color, self.names = out, mode, color, names
        self.timed = False
        self.summary = Summary()
        self.items: dict[Any, _Run] = {}  # open items by id_key(id)
        self.prev_t: float | None = None
        self.chat_run: _Run | None = None
        self.chat_names: dict[int, str] = {}

    # -- output helpers ----------------------------------------------------------------------

    def paint(self, text: str, color: str) -> str:
        return f"\x1b[{COLORS[color]}m{text}\x1b[0m" if self.color else text

    def line(self, position: str, t: float, text: str, since: float | None) -> None:
        prefix = ""
        if self.timed:
            gap = "" if since is None else f"+{ms(t - since)}"
            prefix = self.paint(f"{t:8.3f}s {gap:>8} ", "dim")
        self.out.write(f"{prefix}{self.paint(f'{position:<8}', 'dim')}{text}\n")

    def flag(self, violations: list[Violation]) -> None:
        for v in violations:
            self.out.write(self.paint(f"  ! #{v.position} {v.rule}: {v.message}", "red") + "\n")

    # -- Responses events --------------------------------------------------------------------

    def event(self, position: int, t: float, event: Any, violations: list[Violation]) -> None:
        """One Responses event (a dict) or a frame that could not be decoded (its text)."""
        self.summary.count(t)
        self.summary.violations += len(violations)
        kind = event.get("type") if isinstance(event, dict) else None
        run = self._track(position, t, event, kind)
        if self.mode == "json":
            self._json(position, t, kind, event, run.ident if run else None, violations)
        elif self.mode == "follow":
            self.line(f"#{position}", t, self._describe(event, kind, run), self.prev_t)
            self.flag(violations)
        elif run is not None and kind != "response.output_item.done":
            run.violations += violations  # shown under the item's line when it is done
        elif run is not None:
            self._item_line(run, f"#{run.first}-{position}", self._status(run.item))
            self.flag(violations)
        else:
            if isinstance(kind, str) and kind in STREAM_END_TYPES:
                self._open_items()
            self.line(f"#{position}", t, self._describe(event, kind, None), self.prev_t)
            self.flag(violations)
        self.prev_t = t

    def _track(self, position: int, t: float, event: Any, kind: Any) -> _Run | None:
        """Follow items (for collapsing, identities and the summary): the event's item."""
        if not isinstance(event, dict):
            return None
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = _dict(event.get("item"))
            ident = identity(
                str(item.get("type")), item.get("name"), item.get("namespace"), self.names
            )
            if kind.endswith(".done"):
                run = self.items.pop(id_key(item.get("id")), None)
                if run is not None:
                    run.item, run.ident = item, ident
                return run
            run = _Run(position, t, self.prev_t, item, ident)
            self.items[id_key(item.get("id"))] = run
            self.summary.items[str(item.get("type"))] += 1
            if ident is not None:
                self.summary.calls[label(ident)] += 1
            return run
        if isinstance(kind, str) and kind in STREAM_END_TYPES:
            response = _dict(event.get("response"))
            self.summary.terminal = response.get("status") or kind
            self.summary.usage = response.get("usage") or self.summary.usage
        run = self.items.get(id_key(event.get("item_id")))
        if run is None or not isinstance(kind, str):
            return run
        family = "summary" if "summary_index" in event else "content"
        index = id_key(event.get(f"{family}_index"))
        if kind in PART_ADDED:
            part = _dict(event.get("part"))
            run.part_types[(family, index)] = str(part.get("type", family))
        elif kind.endswith(".delta"):
            delta = event.get("delta")
            text = delta if isinstance(delta, str) else ""
            target = run.args if index is None else run.parts.setdefault((family, index), [])
            target.append(text)
        return run

    def _status(self, item: dict[str, Any]) -> str:
        status = str(item.get("status", ""))
        return self.paint(status, STATUS_COLOR.get(status, "dim"))

    def _item_line(self, run: _Run, position: str, status: str) -> None:
        item = run.item
        head = f"[{item.get('type')}] {item.get('id')} {status}"
        self.line(position, run.t, f"{head}  {self._item_body(run)}".rstrip(), run.since)
        self.flag(run.violations)

    def _item_body(self, run: _Run) -> str:
        item, out = run.item, []
        if run.ident is not None:
            call = label(run.ident)
            if item.get("name") and not item.get("namespace") and run.ident["namespace"]:
                call = f"{item['name']} → {call}"  # a flat name, decoded through the tool map
            out.append(self.paint(call, "magenta") + f" {item.get('call_id')}")
        for where, chunks in run.parts.items():
            kind = run.part_types.get(where, where[0])
            out.append(f"{kind} {quote(''.join(chunks))} ({plural(len(chunks), 'delta')})")
        for family in ("content", "summary"):
            parts = item.get(family)
            for i, part in enumerate(parts if isinstance(parts, list) else []):
                if (family, i) not in run.parts and part_text(part):
                    out.append(f"{part.get('type')} {quote(part_text(part) or '')}")
        field_name = "input" if item.get("type") == "custom_tool_call" else "arguments"
        text = item.get(field_name)
        if isinstance(text, str | dict) and run.ident is not None:
            shown = quote(text) if isinstance(text, str) and field_name == "input" else None
            shown = shown or raw_json(
                text if isinstance(text, str) else orjson.dumps(text).decode()
            )
            count = f" ({plural(len(run.args), 'delta')})" if run.args else ""
            out.append(f"{field_name} {shown}{count}")
        return "  ".join(out)

    def _open_items(self) -> None:
        """Items never done (a failure, a cut stream): show what they streamed, once."""
        if self.mode == "timeline":
            for run in self.items.values():
                self._item_line(run, f"#{run.first}-", self.paint("never done", "red"))
        self.items.clear()

    def _describe(self, event: Any, kind: Any, run: _Run | None) -> str:
        if not isinstance(event, dict):
            return self.paint(f"malformed frame {quote(str(event))}", "red")
        kind = str(kind)
        text = self.paint(kind, "cyan" if "." not in kind.removeprefix("response.") else "blue")
        response = event.get("response")
        if isinstance(response, dict):
            text += f"  {response.get('id')} {self._status(response)}"
            details = response.get("incomplete_details")
            if isinstance(details, dict):
                text += f" ({details.get('reason')})"
            if isinstance(response.get("error"), dict):
                error = response["error"]
                text += self.paint(f"  {error.get('code')}: {error.get('message')}", "red")
            return text
        if kind == "error":
            error = event.get("error")
            err = error if isinstance(error, dict) else _dict(event)
            return text + self.paint(f"  {err.get('code')}: {err.get('message')}", "red")
        if isinstance(event.get("item"), dict):
            item = event["item"]
            extra = f"  {self.paint(label(run.ident), 'magenta')}" if run and run.ident else ""
            where = f"[{event.get('output_index')}] {item.get('type')} {item.get('id')}"
            return f"{text}  {where}{extra}"
        if isinstance(event.get("part"), dict):
            family = "summary" if "summary_index" in event else "content"
            where = f"{event.get('item_id')} {family}[{event.get(f'{family}_index')}]"
            return f"{text}  {where} {event['part'].get('type')}"
        for key in ("delta", "text", "arguments", "input", "refusal"):
            if isinstance(event.get(key), str):
                return text + f"  {event.get('item_id')} {quote(event[key])}"
        return text

    def _json(
        self, position: int, t: float, kind: Any, event: Any, ident: Any, found: list[Violation]
    ) -> None:
        record = {
            "position": position,
            "t": round(t, 6) if self.timed else None,
            "type": kind,
            "event": event,
            "identity": ident,
            "violations": [{"rule": v.rule, "message": v.message} for v in found],
        }
        self.out.write(orjson.dumps(record).decode() + "\n")

    # -- Chat Completions deltas -------------------------------------------------------------

    def chat(self, position: int, t: float, delta: Any) -> None:
        """A model delta of a Chat Completions stream, or its [DONE]."""
        s = self.summary
        s.count(t)
        kind = "chat.done" if isinstance(delta, ChatDone) else CHAT_TYPES.get(type(delta), "chat")
        s.items[kind] += 1
        ident = None
        if isinstance(delta, d.ToolCallDelta):
            name = self.chat_names.get(delta.index, "") + (delta.name or "")
            self.chat_names[delta.index] = name
            ident = identity("function_call", name, None, self.names)
        elif isinstance(delta, d.Usage):
            s.usage = {
                "input_tokens": delta.input_tokens,
                "input_tokens_details": {"cached_tokens": delta.cached_tokens},
                "output_tokens": delta.output_tokens,
                "output_tokens_details": {"reasoning_tokens": delta.reasoning_tokens},
                "total_tokens": delta.input_tokens + delta.output_tokens,
            }
        elif isinstance(delta, d.Finish | d.UpstreamError):
            s.terminal = delta.reason if isinstance(delta, d.Finish) else f"error {delta.code}"
        is_instance = dataclasses.is_dataclass(delta) and not isinstance(delta, type)
        fields = dataclasses.asdict(delta) if is_instance else {}
        if self.mode == "json":
            self._json(position, t, kind, fields, ident, [])
        elif self.mode == "follow":
            shown = "  ".join(
                f"{k}={quote(v) if isinstance(v, str) else v}" for k, v in fields.items()
            )
            extra = f"  {self.paint(label(ident), 'magenta')}" if ident else ""
            self.line(f"#{position}", t, f"{self.paint(kind, 'blue')}  {shown}{extra}", self.prev_t)
        else:
            self._chat_collapse(position, t, kind, delta, fields, ident)
        self.prev_t = t

    def _chat_collapse(
        self, position: int, t: float, kind: str, delta: Any, fields: dict[str, Any], ident: Any
    ) -> None:
        key = ("tool_call", delta.index) if isinstance(delta, d.ToolCallDelta) else kind
        collapsible = isinstance(delta, d.TextDelta | d.ReasoningDelta | d.RefusalDelta)
        run = self.chat_run
        if run is None or run.key != key:
            self._chat_flush(position - 1)
            if not (collapsible or isinstance(delta, d.ToolCallDelta)):
                shown = "  ".join(f"{k}={v}" for k, v in fields.items())
                self.line(
                    f"#{position}", t, f"{self.paint(kind, 'blue')}  {shown}".rstrip(), self.prev_t
                )
                return
            run = self.chat_run = _Run(position, t, self.prev_t, key=key)
        if isinstance(delta, d.ToolCallDelta):
            run.ident = ident
            run.item.setdefault("id", delta.id)
            run.args.append(delta.arguments)
        else:
            run.args.append(delta.text)

    def _chat_flush(self, last: int) -> None:
        run, self.chat_run = self.chat_run, None
        if run is None:
            return
        count = f"({plural(len(run.args), 'delta')})"
        if isinstance(run.key, tuple):
            name = self.chat_names.get(run.key[1], "")
            call = label(run.ident) if run.ident else name
            call = call if call == name else f"{name} → {call}"
            text = f"tool_call[{run.key[1]}] {run.item.get('id')} {self.paint(call, 'magenta')}"
            text += f"  arguments {raw_json(''.join(run.args))} {count}"
        else:
            text = f"{self.paint(str(run.key), 'blue')}  {quote(''.join(run.args))} {count}"
        span = f"#{run.first}" if last == run.first else f"#{run.first}-{last}"
        self.line(span, run.t, text, run.since)

    # -- the end -----------------------------------------------------------------------------

    def end(
        self, violations: list[Violation], *, source_format: str | None, note: str | None
    ) -> None:
        self._chat_flush(self.summary.events - 1)
        self._open_items()
        for index, name in self.chat_names.items():
            ident = identity("function_call", name, None, self.names)
            self.summary.calls[label(ident) if ident else f"[{index}]"] += 1
        self.summary.violations += len(violations)
        data = self.summary_data(source_format, note)
        if self.mode == "json":
            extra = [
                {"rule": v.rule, "message": v.message, "position": v.position} for v in violations
            ]
            self.out.write(
                orjson.dumps({"summary": {**data, "end_violations": extra}}).decode() + "\n"
            )
            return
        self.flag(violations)
        if note:
            self.out.write(self.paint(f"  ! {note}", "red") + "\n")
        self.out.write(self.paint("── summary ──", "bold") + "\n")
        for key, value in rows(data, source_format, self.paint):
            self.out.write(f"{key:<11}{value}\n")

    def summary_data(self, source_format: str | None, note: str | None) -> dict[str, Any]:
        return self.summary.data(source_format, note, self.timed)


__all__ = ["Renderer", "identity", "label", "ms", "plural", "quote", "raw_json"]
