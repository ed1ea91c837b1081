"""The turn's limits as plain values: the streamer counts, the pipeline acts.

Output characters and items (`OutputLimits`), the turn's deadline (`TurnClock`), the
JSON body budget (`ByteBudget`), and the memory a held tool call costs.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
from builders import ONE_FUNCTION as TOOLS
from sdk_models import validate_event, validate_response
from test_faults import _sdk_view

from streamer.config import Settings
from streamer.core.batch import Batch
from streamer.core.deltas import Delta, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from streamer.core.events import Event
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.turns.options import turn_options
from streamer.turns.turn import TurnOptions, prepare
from streamer.turns.turn_runner import stream_events
from streamer.upstream.body_budget import ByteBudget


def streamer(max_chars: int = 1 << 30, max_items: int = 1 << 30) -> OutputItemStreamer:
    names = ResponsesToolNames.convert(TOOLS, [])
    response = new_response({"model": "m", "tools": TOOLS})
    return OutputItemStreamer(names, response, limits=OutputLimits(max_chars, max_items))


def run(s: OutputItemStreamer, batches: list[list[Delta]]) -> list[Event]:
    """Feed the batches until the streamer is past a limit, then end as the pipeline does."""
    events = s.start()
    for batch in batches:
        events += s.feed(batch)
        if s.exceeded:
            break
    events += s.cut() if s.exceeded else s.finish()
    for event in events:
        validate_event(_sdk_view(orjson.loads(event.data)))
    validate_response(_sdk_view(s.response))
    return events


def texts(response: dict[str, Any]) -> list[str]:
    return [part["text"] for item in response["output"] for part in item.get("content", [])]


# -- output characters ------------------------------------------------------------------


def test_text_is_cut_to_the_limit_and_the_turn_ends_incomplete() -> None:
    s = streamer(max_chars=10)
    events = run(s, [[TextDelta("abcd")], [TextDelta("efgh"), TextDelta("ijkl")], [TextDelta("m")]])
    assert s.exceeded == "max_output_bytes"
    assert s.response["status"] == "incomplete"
    assert s.response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert texts(s.response) == ["abcdefghij"]  # the output so far, to the character
    deltas = [orjson.loads(e.data)["delta"] for e in events if e.type.endswith("text.delta")]
    assert deltas == ["abcd", "efgh", "ij"]
    assert events[-1].type == "response.incomplete"


def test_nothing_is_taken_once_past_the_limit() -> None:
    s = streamer(max_chars=3)
    s.start()
    s.feed([TextDelta("abcdef")])
    assert s.exceeded == "max_output_bytes"
    assert s.feed([TextDelta("more")]) == []
    done = s.finish()  # a caller that does not know about limits still ends it `incomplete`
    assert done[-1].type == "response.incomplete"
    assert texts(s.response) == ["abc"]


def test_reasoning_and_arguments_count_too() -> None:
    s = streamer(max_chars=18)
    run(
        s,
        [
            [ReasoningDelta("think")],  # 5
            [ToolCallDelta(0, "call_1", "f", '{"a"')],  # 6 (id) + 1 (name) + 4
            [ToolCallDelta(0, None, None, ": 12345}")],  # 2 fit
        ],
    )
    assert s.exceeded == "max_output_bytes"
    call = s.response["output"][-1]
    assert call["type"] == "function_call" and call["status"] == "incomplete"
    assert call["arguments"] == '{"a": '


def test_a_name_that_never_stops_growing_is_counted() -> None:
    s = streamer(max_chars=100)
    run(s, [[ToolCallDelta(0, None, chr(97 + i) * 30, "")] for i in range(10)])
    assert s.exceeded == "max_output_bytes"


def test_within_the_limits_nothing_changes() -> None:
    batches: list[list[Delta]] = [[TextDelta("hello")], [TextDelta(" world")], [Finish("stop")]]
    limited, free = streamer(max_chars=11, max_items=1), streamer()

    def view(events: list[Event]) -> list[tuple[str, Any]]:
        return [(e.type, orjson.loads(e.data).get("delta")) for e in events]

    assert view(run(limited, batches)) == view(run(free, batches))
    assert texts(limited.response) == texts(free.response) == ["hello world"]
    assert limited.exceeded is None and limited.response["status"] == "completed"


# -- output items -------------------------------------------------------------------------


def test_tool_calls_past_the_items_limit_are_not_held() -> None:
    s = streamer(max_items=3)
    batches = [[ToolCallDelta(i, f"call_{i}", "f", "{}")] for i in range(10)]
    run(s, batches)
    assert s.exceeded == "max_output_items"
    calls = [item["call_id"] for item in s.response["output"]]
    assert calls == ["call_0", "call_1", "call_2"]  # whole, in backend order
    assert len(s._calls) == 3  # the fourth was never buffered


def test_alternating_items_stop_at_the_limit() -> None:
    s = streamer(max_items=4)
    batches: list[list[Delta]] = [
        [ReasoningDelta("r") if i % 2 else TextDelta("t")] for i in range(20)
    ]
    run(s, batches)
    assert s.exceeded == "max_output_items"
    assert [item["type"] for item in s.response["output"]] == ["message", "reasoning"] * 2


# -- memory per held tool call --------------------------------------------------------------


def held_call_bytes(count: int) -> tuple[float, float]:
    """Bytes per call: held while buffered, and at the peak of the finish that emits them."""
    # Every call starts before any has arguments (a backend that interleaves calls), so
    # all are held until the finish; calls sent one after another would go out as they end.
    batches = [[ToolCallDelta(i, f"call_{i:08d}", "f", "") for i in range(count)]] + [
        [
            ToolCallDelta(i, None, None, f'{{"a": {i},'),
            ToolCallDelta(i, None, None, ' "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'),
        ]
        for i in range(count)
    ]
    s = streamer()
    s.start()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for batch in batches:
            s.feed(batch)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.reset_peak()
        events = s.finish()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert sum(e.type == "response.output_item.done" for e in events) == count
    return held / count, peak / count


def test_a_held_tool_call_costs_its_arguments_not_4_kb_per_event() -> None:
    held, peak = held_call_bytes(5000)
    print(f"\nper held tool call: {held:.0f} B while buffered, {peak:.0f} B at the finish peak")
    assert held < 400  # the call's few scalars and its argument fragments
    assert peak < 5000  # the base held ~18 kB: four events of ~4 kB each (orjson's buffers)


# -- the JSON body budget --------------------------------------------------------------------


def test_byte_budget_takes_gives_and_refuses() -> None:
    budget = ByteBudget(100)
    assert budget.take(60) and budget.take(40)
    assert not budget.take(1)
    assert (budget.held, budget.refused) == (100, 1)
    budget.give(60)
    assert budget.take(50) and budget.held == 90
    budget.give(90)
    assert (budget.held, budget.peak) == (0, 100)


# -- the turn's deadline -------------------------------------------------------------------


class StalledStream:
    """A backend that sent its head and then nothing, ever (an Event nobody sets)."""

    first = None  # nothing came with the head

    def __init__(self, partial: list[Delta]) -> None:
        self.partial = partial
        self.stall = asyncio.Event()
        self.closed = False

    def __aiter__(self) -> StalledStream:
        return self

    async def __anext__(self) -> Batch:
        if self.partial:
            batch, self.partial = self.partial, []
            return Batch(batch)
        await self.stall.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


class StalledUpstream:
    def __init__(self, stream: StalledStream) -> None:
        self.stream = stream

    async def open(self, backend_request: dict[str, Any], **_: Any) -> StalledStream:
        return self.stream


async def collect_types(events: AsyncIterator[list[Event]]) -> list[Event]:
    return [event async for batch in events for event in batch]


async def test_a_stalled_backend_fails_at_the_turn_deadline() -> None:
    turn = prepare({"model": "m", "input": "hi"}, TurnOptions(max_turn_seconds=0.05))
    stream = StalledStream([TextDelta("partial")])
    events = await asyncio.wait_for(collect_types(stream_events(turn, StalledUpstream(stream))), 10)
    assert events[-1].type == "response.failed"
    assert turn.response["error"]["type"] == "turn_timeout"
    assert texts(turn.response) == ["partial"]
    assert stream.closed


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    """The deadline's own cancel becomes a timeout; anybody else's is left alone."""
    turn = prepare({"model": "m", "input": "hi"}, TurnOptions(max_turn_seconds=60))
    stream = StalledStream([TextDelta("partial")])
    task = asyncio.ensure_future(collect_types(stream_events(turn, StalledUpstream(stream))))
    for _ in range(1000):  # a bounded wait until the first batch is taken
        if not stream.partial or task.done():
            break
        await asyncio.wait({task}, timeout=0.01)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert turn.response["status"] == "in_progress"  # nobody called it a timeout
    assert stream.closed


@pytest.mark.parametrize(
    "field", ["max_output_bytes", "max_output_items", "max_turn_seconds", "max_backend_json_bytes"]
)
def test_a_limit_of_zero_is_refused_at_startup(field: str) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        turn_options(replace(Settings(), **{field: 0}))
    assert turn_options(Settings()).max_output_items == 2048
