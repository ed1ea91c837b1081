"""`streamer tap` never crashes: mutated fixture streams give violations, never tracebacks.

Each example takes a fixture stream, breaks it (a field anywhere replaced by any JSON value,
keys deleted, events duplicated, dropped, moved or replaced), then runs the grammar checker
and the renderer in all three modes over it; a few examples run the whole `run_tap` on a
mutated file. STREAMER_FUZZ_EXAMPLES raises the example count for a longer search.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import io
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.core.sse import SSEDecoder
from streamer.core.tools import ResponsesToolNames
from streamer.tap.command import configure, run_tap
from streamer.tap.grammar import RULES, GrammarChecker, Violation
from streamer.tap.render import Renderer
from streamer.tap.sources import RECORDING, RESPONSES_SSE, WEBSOCKET_LOG

STREAMS = Path(__file__).parent / "fixtures" / "streams"
REQUEST = STREAMS / "request.json"
FIXTURES = sorted(p.name for p in STREAMS.iterdir() if p.suffix in (".sse", ".jsonl"))
MODES = ("timeline", "follow", "json")
EXAMPLES = int(os.environ.get("STREAMER_FUZZ_EXAMPLES", "300"))
COMMON: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


class Fixture:
    """A fixture's events (a recording: its client events), and how to write them back."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = STREAMS / name
        self.header: list[dict[str, Any]] = []  # a recording's other lines, kept as they are
        self.events: list[Any] = []
        if self.path.suffix == ".sse":
            decoder = SSEDecoder()
            messages = decoder.feed(self.path.read_bytes()) + decoder.close()
            self.events = [m.data if m.data == "[DONE]" else orjson.loads(m.data) for m in messages]
            self.format = RESPONSES_SSE
            return
        lines = [orjson.loads(line) for line in self.path.read_bytes().splitlines() if line]
        if all("kind" in line for line in lines):
            self.format = RECORDING
            self.header = [line for line in lines if line["kind"] != "client_event"]
            self.events = [line["event"] for line in lines if line["kind"] == "client_event"]
        else:
            self.format = WEBSOCKET_LOG
            self.events = lines

    def write(self, events: list[Any], path: Path) -> None:
        if self.format == RESPONSES_SSE:
            out = []
            for event in events:
                kind = event.get("type") if isinstance(event, dict) else None
                if isinstance(kind, str) and kind.isprintable():
                    out.append(f"event: {kind}\n")
                data = event if event == "[DONE]" else orjson.dumps(event).decode()
                out.append(f"data: {data}\n\n")
            path.write_text("".join(out))
            return
        lines = list(self.header)
        for i, event in enumerate(events):
            if self.format == RECORDING:
                event = {"t": 1767225601.0 + i / 100, "kind": "client_event", "event": event}
            lines.append(event)
        path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


LOADED = {name: Fixture(name) for name in FIXTURES}
_REQUEST = orjson.loads(REQUEST.read_bytes())
NAMES = ResponsesToolNames.convert(_REQUEST["tools"], _REQUEST["input"])
KEYS = ("type", "id", "item_id", "call_id", "name", "namespace", "status")


def _strings(fixtures: dict[str, Fixture]) -> list[str]:
    """Types, ids and names from the fixtures, so mutations often land on meaningful values."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key in KEYS and isinstance(inner, str):
                    found.add(inner)
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    for fixture in fixtures.values():
        walk(fixture.events)
    return sorted(found)


# What a JSON source can carry: orjson reads bigger integers as floats.
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.integers(-2, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(_strings(LOADED))
)
FIELD = st.text(max_size=6) | st.sampled_from(("type", "id", "text", "status", "name"))
# containers get a fair share: an id or an index that is a list or an object is the usual crash
JSON = (
    LEAF
    | st.lists(LEAF, max_size=3)
    | st.dictionaries(FIELD, LEAF, max_size=3)
    | st.recursive(
        LEAF,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELD, inner, max_size=3),
        max_leaves=6,
    )
)
OPS = ("field", "field", "field", "top", "top", "delete", "whole", "duplicate", "drop", "move")


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path inside a JSON value (not inside the echoed request `tools`)."""
    if isinstance(value, dict):
        pairs: Any = value.items()
    elif isinstance(value, list):
        pairs = enumerate(value)
    else:
        return []
    out = []
    for key, inner in pairs:
        out.append((*prefix, key))
        if key != "tools":
            out += paths(inner, (*prefix, key))
    return out


def parent(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        value = value[key]
    return value


def mutate(data: st.DataObject, events: list[Any]) -> list[Any]:
    events = copy.deepcopy(events)
    for _ in range(data.draw(st.integers(1, 6), label="mutations")):
        if not events:
            events.append(data.draw(JSON))
            continue
        i = data.draw(st.integers(0, len(events) - 1), label="event")
        op = data.draw(st.sampled_from(OPS), label="op")
        inside = paths(events[i])
        if op == "top" and isinstance(events[i], dict):
            key = data.draw(st.sampled_from([*events[i], "type", "item_id", "sequence_number"]))
            events[i][key] = data.draw(JSON)
        elif op in ("field", "delete") and inside:
            path = data.draw(st.sampled_from(inside), label="path")
            holder = parent(events[i], path)
            if op == "field":
                holder[path[-1]] = data.draw(JSON)
            else:
                del holder[path[-1]]
        elif op == "duplicate":
            events.insert(i, copy.deepcopy(events[i]))
        elif op == "drop":
            del events[i]
        elif op == "move":
            events.insert(data.draw(st.integers(0, len(events) - 1)), events.pop(i))
        else:
            events[i] = data.draw(JSON)
    return events


def check_and_render(
    events: list[Any],
    names: ResponsesToolNames | None = None,
    *,
    session: bool = False,
    color: bool = False,
    timed: bool = False,
) -> tuple[list[Violation], dict[str, str]]:
    """Every violation, and each mode's output; asserts what holds for any stream."""
    checker = GrammarChecker(names, session=session)
    found = []
    for position, event in enumerate(events):
        violations = checker.feed(event)
        assert all(v.rule in RULES and v.position == position and v.message for v in violations)
        found.append(violations)
    end = checker.finish()
    assert all(v.rule in RULES and v.position == len(events) for v in end)
    total = sum(map(len, found)) + len(end)
    outputs = {}
    for mode in MODES:
        out = io.StringIO()
        renderer = Renderer(out, mode=mode, color=color and mode != "json", names=names)
        renderer.timed = timed
        for position, (event, violations) in enumerate(zip(events, found, strict=True)):
            renderer.event(position, position / 10, event, violations)
        renderer.end(end, source_format=RESPONSES_SSE, note=None)
        assert renderer.summary.events == len(events)
        assert renderer.summary.violations == total
        outputs[mode] = out.getvalue()
        if mode == "json":
            lines = [orjson.loads(line) for line in outputs[mode].encode().splitlines()]
            assert len(lines) == len(events) + 1
            assert lines[-1]["summary"]["violations"] == total
            assert [r["position"] for r in lines[:-1]] == list(range(len(events)))
        else:
            assert "── summary ──" in outputs[mode]
    return [v for vs in found for v in vs] + end, outputs


@settings(max_examples=EXAMPLES, **COMMON)
@given(st.data())
def test_checker_and_renderer_survive_mutated_streams(data: st.DataObject) -> None:
    fixture = LOADED[data.draw(st.sampled_from(FIXTURES), label="fixture")]
    events = mutate(data, fixture.events)
    check_and_render(
        events,
        NAMES if data.draw(st.booleans(), label="names") else None,
        session=data.draw(st.booleans(), label="session"),
        color=data.draw(st.booleans(), label="color"),
        timed=data.draw(st.booleans(), label="timed"),
    )


DELETE = object()
USAGE = {"input_tokens": 3, "input_tokens_details": [1], "output_tokens_details": "x"}
# (fixture, path, value, the first violation expected, or None for a clean stream)
MALFORMED: list[tuple[str, str, Any, tuple[str, int] | None]] = [
    ("text.sse", "3.part", "x", ("event.malformed", 3)),
    ("text.sse", "3.part", DELETE, ("event.malformed", 3)),
    ("text.sse", "9.part", [1], ("event.malformed", 9)),
    ("reasoning.sse", "3.part", 7, ("event.malformed", 3)),
    ("text.sse", "2.item", 5, ("event.malformed", 2)),
    ("text.sse", "10.item", [5], ("event.malformed", 10)),
    ("text.sse", "5.item_id", [1], ("ref.item", 5)),
    ("text.sse", "5.item_id", {"id": "msg_text_001"}, ("ref.item", 5)),
    ("text.sse", "5.output_index", 0.0, ("ref.item", 5)),
    ("text.sse", "2.item.id", ["msg_text_001"], ("item.id_missing", 2)),
    ("text.sse", "2.output_index", True, ("item.output_index", 2)),
    ("text.sse", "10.item.id", {"a": 1}, ("item.done_unmatched", 10)),
    ("text.sse", "3.content_index", 0.0, ("part.index", 3)),
    ("text.sse", "3.content_index", [0], ("part.index", 3)),
    ("text.sse", "4.content_index", {}, ("ref.part", 4)),
    ("text.sse", "9.content_index", True, ("part.unmatched", 9)),
    ("reasoning.sse", "3.summary_index", 0.0, ("part.index", 3)),
    ("reasoning.sse", "7.summary_index", "0", ("part.unmatched", 7)),
    ("text.sse", "4.sequence_number", "4", ("sequence.missing", 4)),
    ("text.sse", "4.sequence_number", True, ("sequence.missing", 4)),
    ("text.sse", "4.sequence_number", 4.0, ("sequence.missing", 4)),
    ("text.sse", "5.delta", {"x": 1}, ("done.mismatch", 8)),
    ("namespaced_call.sse", "6.arguments", [1], ("done.mismatch", 6)),
    ("namespaced_call.sse", "2.item.call_id", [1], ("call.id_missing", 2)),
    ("namespaced_call.sse", "2.item.namespace", ["mcp__docs"], ("tool.undeclared", 2)),
    ("namespaced_call.sse", "2.item.name", {"x": 1}, ("call.identity_changed", 7)),
    ("text.sse", "11.response", [1], ("terminal.status", 11)),
    ("text.sse", "11.response.output", {"a": 1}, ("terminal.output", 11)),
    ("text.sse", "11.response.output.0", "x", ("terminal.output", 11)),
    ("failed.sse", "5.response.output", [{"id": ["msg_failed_001"]}], None),
    ("text.sse", "11.response.usage", USAGE, None),
]


def set_path(events: list[Any], path: str, value: Any) -> None:
    *head, last = (int(k) if k.isdigit() else k for k in path.split("."))
    target: Any = events
    for key in head:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value


@pytest.mark.parametrize(
    ("name", "path", "value", "first"), MALFORMED, ids=[f"{c[0]}:{c[1]}" for c in MALFORMED]
)
def test_malformed_field_is_a_violation(
    name: str, path: str, value: Any, first: tuple[str, int] | None
) -> None:
    events = copy.deepcopy(LOADED[name].events)
    assert check_and_render(events, NAMES)[0] == []
    set_path(events, path, value)
    found, outputs = check_and_render(events, NAMES)
    assert [(v.rule, v.position) for v in found][:1] == ([first] if first else [])
    if value is USAGE:  # odd details are counted as 0, the rest still shown
        assert "input 3 (cached 0)" in outputs["timeline"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tap_robust")


@settings(max_examples=max(EXAMPLES // 6, 10), **COMMON)
@given(st.data())
def test_run_tap_survives_mutated_files(workdir: Path, data: st.DataObject) -> None:
    fixture = LOADED[data.draw(st.sampled_from(FIXTURES), label="fixture")]
    events = mutate(data, fixture.events)
    path = workdir / fixture.name
    fixture.write(events, path)
    argv = [str(path), "--color", data.draw(st.sampled_from(("never", "always")))]
    argv += data.draw(st.sampled_from(([], ["--json"], ["--follow"])), label="mode")
    argv += ["--tools", str(REQUEST)] if data.draw(st.booleans(), label="tools") else []
    parser = argparse.ArgumentParser()
    configure(parser)
    out = io.StringIO()
    status = asyncio.run(run_tap(parser.parse_args(argv), out))
    if fixture.format == WEBSOCKET_LOG and events and not isinstance(events[0], dict):
        # a file whose first line is not an object is not recognised as JSON lines at all
        assert status == 2
        return
    assert status in (0, 1)
    if "--json" in argv:
        summary = orjson.loads(out.getvalue().encode().splitlines()[-1])["summary"]
        assert (summary["violations"] > 0) == (status == 1)
