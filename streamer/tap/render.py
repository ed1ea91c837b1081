"""How a tapped stream is shown: a timeline for people, or JSON lines for programs.

Three modes share one `Renderer`:
- `timeline` (default): one line per output item (its deltas collapsed into their text, with
  counts), lifecycle and other events on their own lines, violations under the line where
  they occur;
- `follow`: one line per event, printed as it arrives;
- `json`: one object per event `{position, t, type, event, identity, violations}`, then one
  `{"summary": {...}}` object.
All end with a summary: items, calls by identity, tokens, time to first event, events/s.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from streamer import deltas as d
from streamer.tap.grammar import Violation, part_text
from streamer.tap.sources import ChatDone

CALL_KINDS = {"function_call": "function", "custom_tool_call": "custom"}
COLORS = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34"}
COLORS |= {"magenta": "35", "cyan": "36"}
STATUS_COLOR = {"completed": "green", "incomplete": "yellow", "failed": "red"}
CHAT_TYPES = {
    d.TextDelta: "chat.text",
    d.ReasoningDelta: "chat.reasoning",
    d.RefusalDelta: "chat.refusal",
    d.ToolCallDelta: "chat.tool_call",
    d.Finish: "chat.finish",
    d.Usage: "chat.usage",
    d.UpstreamError: "chat.error",
}


def identity(item_type: str, name: Any, namespace: Any, names: Any | None) -> dict[str, Any] | None:
    """A call's client identity: its own namespace, else its name decoded through the map."""
    if item_type == "tool_search_call":
        return {"namespace": None, "name": "tool_search", "kind": "tool_search"}
    kind = CALL_KINDS.get(item_type)
    if kind is None or not isinstance(name, str):
        return None
    if namespace or names is None:
        return {"namespace": namespace or None, "name": name, "kind": kind}
    ident = names.decode(name)
    return {"namespace": ident.namespace, "name": ident.name, "kind": ident.kind}


def label(ident: dict[str, Any] | None) -> str:
    if ident is None:
        return "?"
    return f"{ident['namespace']}/{ident['name']}" if ident["namespace"] else ident["name"]


def quote(text: str, limit: int = 80) -> str:
    short = orjson.dumps(text[:limit]).decode()
    return short + "…" if len(text) > limit else short


@dataclass(slots=True)
class _ItemView:
    first: int
    t: float
    item: dict[str, Any]
    ident: dict[str, Any] | None
    parts: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)


@dataclass(slots=True)
class Summary:
    events: int = 0
    items: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    usage: dict[str, Any] | None = None
    terminal: str | None = None
    first_t: float | None = None
    last_t: float | None = None
    violations: int = 0


class Renderer:
    def __init__(
        self, out: TextIO, *, mode: str = "timeline", color: bool = False, names: Any = None
    ) -> None:
        self.out, self.mode, self.color, self.names = out, mode, color, names
        self.timed = False
        self.summary = Summary()
        self.items: dict[Any, _ItemView] = {}
        self.prev_t: float | None = None
        self.chat_names: dict[int, str] = {}
        self.chat_text: dict[str, list[str]] = {}

    # -- output helpers ----------------------------------------------------------------------

    def paint(self, text: str, color: str) -> str:
        return f"\x1b[{COLORS[color]}m{text}\x1b[0m" if self.color else text

    def line(self, position: str, t: float | None, text: str) -> None:
        prefix = ""
        if self.timed and t is not None:
            gap = "" if self.prev_t is None else f"+{(t - self.prev_t) * 1000:.0f}ms"
            prefix = self.paint(f"{t:8.3f}s {gap:>8} ", "dim")
        self.out.write(f"{prefix}{self.paint(f'{position:<8}', 'dim')}{text}\n")

    def flag(self, violations: list[Violation]) -> None:
        for v in violations:
            self.out.write(self.paint(f"  ! #{v.position} {v.rule}: {v.message}", "red") + "\n")

    # -- events ------------------------------------------------------------------------------

    def event(self, position: int, t: float, event: Any, violations: list[Violation]) -> None:
        """One Responses event (a dict) or a frame that could not be decoded (its text)."""
        s = self.summary
        s.events += 1
        s.violations += len(violations)
        s.first_t = t if s.first_t is None else s.first_t
        s.last_t = t
        kind = event.get("type") if isinstance(event, dict) else None
        view = self._track(position, t, event, kind)
        if self.mode == "json":
            ident = view.ident if view is not None else None
            self._json(position, t, str(kind) if kind else None, event, ident, violations)
        elif self.mode == "follow":
            self.line(f"#{position}", t, self._describe(event, kind, view))
            self.flag(violations)
        elif view is not None and kind != "response.output_item.done":
            view.violations += violations  # shown under the item's line when it is done
        else:
            if view is not None:
                self._item_line(view, position, t, violations)
            else:
                self.line(f"#{position}", t, self._describe(event, kind, None))
                self.flag(violations)
        self.prev_t = t

    def _track(self, position: int, t: float, event: Any, kind: Any) -> _ItemView | None:
        """Follow items (for collapsing, identities and the summary); the event's item view."""
        if not isinstance(event, dict):
            return None
        if kind == "response.output_item.added":
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            ident = identity(str(item.get("type")), item.get("name"), item.get("namespace"), self.names)
            view = _ItemView(position, t, item, ident)
            self.items[item.get("id")] = view
            return view
        if kind == "response.output_item.done":
            item = event.get("item") if isinstance(event.get("item"), dict) else {}
            view = self.items.pop(item.get("id"), None)
            if view is None:
                return None
            view.item = item
            view.ident = identity(str(item.get("type")), item.get("name"), item.get("namespace"), self.names)
            self.summary.items[str(item.get("type"))] += 1
            if view.ident is not None:
                self.summary.calls[label(view.ident)] += 1
            return view
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response") if isinstance(event.get("response"), dict) else {}
            self.summary.terminal = response.get("status") or kind
            self.summary.usage = response.get("usage") or self.summary.usage
        elif kind == "error":
            self.summary.terminal = "error"
        view = self.items.get(event.get("item_id"))
        if view is not None and isinstance(kind, str) and kind.endswith(".delta"):
            text = event.get("delta") if isinstance(event.get("delta"), str) else ""
            if "summary_index" in event:
                view.parts.setdefault(("summary", event["summary_index"]), []).append(text)
            elif "content_index" in event:
                view.parts.setdefault(("content", event["content_index"]), []).append(text)
            else:
                view.args.append(text)
        return view

    def _item_line(self, view: _ItemView, position: int, t: float, violations: list[Violation]) -> None:
        item = view.item
        status = str(item.get("status", ""))
        head = f"[{item.get('type')}] {item.get('id')} " + self.paint(status, STATUS_COLOR.get(status, "dim"))
        bits = [self._item_body(view)]
        self.line(f"#{view.first}-{position}", view.t, f"{head}  {'  '.join(b for b in bits if b)}")
        self.flag(view.violations + violations)

    def _item_body(self, view: _ItemView) -> str:
        item, out = view.item, []
        if view.ident is not None:
            call = label(view.ident)
            if item.get("name") and not item.get("namespace") and view.ident["namespace"]:
                call = f"{item['name']} → {call}"  # a flat name, decoded through the tool map
            out.append(self.paint(call, "magenta") + f" {item.get('call_id')}")
        for (family, index), chunks in view.parts.items():
            out.append(f"{family}[{index}] {quote(''.join(chunks))} ({len(chunks)} deltas)")
        for key in ("content", "summary"):
            for i, part in enumerate(item.get(key) or []):
                family = "summary" if key == "summary" else "content"
                if (family, i) not in view.parts and part_text(part):
                    out.append(f"{part.get('type')} {quote(part_text(part) or '')}")
        field_name = "input" if item.get("type") == "custom_tool_call" else "arguments"
        text = item.get(field_name)
        if isinstance(text, str | dict) and view.ident is not None:
            text = text if isinstance(text, str) else orjson.dumps(text).decode()
            count = f" ({len(view.args)} deltas)" if view.args else ""
            out.append(f"{field_name} {quote(text)}{count}")
        return "  ".join(out)

    def _describe(self, event: Any, kind: Any, view: _ItemView | None) -> str:
        if not isinstance(event, dict):
            return self.paint(f"malformed frame {quote(str(event))}", "red")
        kind = str(kind)
        text = self.paint(kind, "cyan" if "." not in kind.removeprefix("response.") else "blue")
        response = event.get("response")
        if isinstance(response, dict):
            status = str(response.get("status"))
            text += f"  {response.get('id')} " + self.paint(status, STATUS_COLOR.get(status, "dim"))
            if response.get("incomplete_details"):
                text += f" ({(response['incomplete_details'] or {}).get('reason')})"
            if isinstance(response.get("error"), dict):
                text += f"  {response['error'].get('code')}: {response['error'].get('message')}"
            return text
        if kind == "error":
            err = event.get("error") if isinstance(event.get("error"), dict) else event
            return text + self.paint(f"  {err.get('code')}: {err.get('message')}", "red")
        if "item" in event and isinstance(event["item"], dict):
            item = event["item"]
            extra = f"  {self.paint(label(view.ident), 'magenta')}" if view and view.ident else ""
            return text + f"  [{event.get('output_index')}] {item.get('type')} {item.get('id')}{extra}"
        for key in ("delta", "text", "arguments", "input", "refusal"):
            if isinstance(event.get(key), str):
                return text + f"  {event.get('item_id')} {quote(event[key])}"
        return text

    def _json(
        self, position: int, t: float, kind: str | None, event: Any, ident: Any, violations: list[Violation]
    ) -> None:
        record = {
            "position": position,
            "t": round(t, 6) if self.timed else None,
            "type": kind,
            "event": event,
            "identity": ident,
            "violations": [{"rule": v.rule, "message": v.message, "position": v.position} for v in violations],
        }
        self.out.write(orjson.dumps(record).decode() + "\n")

    # -- chat (model deltas) -----------------------------------------------------------------

    def chat(self, position: int, t: float, delta: Any) -> None:
        """A model delta of a Chat Completions stream, or its [DONE]."""
        s = self.summary
        s.events += 1
        s.first_t = t if s.first_t is None else s.first_t
        s.last_t = t
        kind = "chat.done" if isinstance(delta, ChatDone) else CHAT_TYPES.get(type(delta), "chat.other")
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
        elif isinstance(delta, d.Finish):
            s.terminal = delta.reason
        if self.mode == "json":
            body = dataclasses.asdict(delta) if dataclasses.is_dataclass(delta) else {}
            self._json(position, t, kind, body, ident, [])
        elif self.mode == "follow" or not isinstance(delta, d.TextDelta | d.ReasoningDelta | d.RefusalDelta):
            self._chat_flush()
            fields = dataclasses.asdict(delta) if dataclasses.is_dataclass(delta) else {}
            shown = "  ".join(f"{k}={quote(v) if isinstance(v, str) else v}" for k, v in fields.items())
            if ident is not None:
                shown += "  " + self.paint(label(ident), "magenta")
            self.line(f"#{position}", t, f"{self.paint(kind, 'blue')}  {shown}")
        else:
            self.chat_text.setdefault(kind, []).append(delta.text)
        self.prev_t = t

    def _chat_flush(self) -> None:
        for kind, chunks in self.chat_text.items():
            self.line("", None, f"{self.paint(kind, 'blue')}  {quote(''.join(chunks))} ({len(chunks)} deltas)")
        self.chat_text.clear()

    # -- the end -----------------------------------------------------------------------------

    def end(self, violations: list[Violation], *, source_format: str | None, note: str | None) -> None:
        self._chat_flush()
        for view in list(self.items.values()):  # items never done: show what they streamed
            if self.mode == "timeline":
                self.line(f"#{view.first}-", view.t, f"[{view.item.get('type')}] {view.item.get('id')} "
                          + self.paint("never done", "red") + f"  {self._item_body(view)}")
                self.flag(view.violations)
        self.summary.violations += len(violations)
        data = self.summary_data(source_format, note)
        if self.mode == "json":
            extra = [{"rule": v.rule, "message": v.message, "position": v.position} for v in violations]
            self.out.write(orjson.dumps({"summary": {**data, "end_violations": extra}}).decode() + "\n")
            return
        self.flag(violations)
        if note:
            self.out.write(self.paint(f"  ! {note}", "red") + "\n")
        self.out.write(self.paint("── summary ──", "bold") + "\n")
        items = ", ".join(f"{k} ×{v}" for k, v in data["items"].items()) or "none"
        calls = ", ".join(f"{k} ×{v}" for k, v in data["calls"].items()) or "none"
        rows = [("events", f"{data['events']} ({source_format or 'no format'}), ended {data['terminal'] or 'without a terminal'}"),
                ("items", items), ("calls", calls)]
        if data["tokens"]:
            tk = data["tokens"]
            rows.append(("tokens", f"input {tk['input']} (cached {tk['cached']}) · output {tk['output']} (reasoning {tk['reasoning']}) · total {tk['total']}"))
        if data["time_to_first_event"] is not None:
            rate = data["events_per_second"]
            rows.append(("timing", f"first event after {data['time_to_first_event'] * 1000:.0f}ms"
                         + (f" · {rate:.0f} events/s" if rate else "")))
        count = data["violations"]
        rows.append(("violations", self.paint(str(count), "red" if count else "green")))
        for key, value in rows:
            self.out.write(f"{key:<11}{value}\n")

    def summary_data(self, source_format: str | None, note: str | None) -> dict[str, Any]:
        s = self.summary
        usage = s.usage if isinstance(s.usage, dict) else None
        tokens = None
        if usage:
            tokens = {
                "input": usage.get("input_tokens", 0),
                "cached": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
                "output": usage.get("output_tokens", 0),
                "reasoning": (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0),
                "total": usage.get("total_tokens", 0),
            }
        span = (s.last_t or 0.0) - (s.first_t or 0.0)
        timed = self.timed and s.first_t is not None
        return {
            "format": source_format,
            "events": s.events,
            "terminal": s.terminal,
            "items": dict(s.items),
            "calls": dict(s.calls),
            "tokens": tokens,
            "time_to_first_event": round(s.first_t, 6) if timed else None,
            "events_per_second": round(s.events / span, 1) if timed and span > 0 else None,
            "violations": s.violations,
            "note": note,
        }
