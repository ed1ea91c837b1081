"""The per-token paths of `OutputItemStreamer.feed` against the handlers (differential).

`feed` inlines two cases (text into the open text part, argument fragments of the call
streaming live) and builds events with the C-level tuple constructor; with
`per_token_paths = False` every delta goes through its handler instead. On random turns, split
into random batches, under random output limits, both must produce the same events, byte for
byte, and the same final response.
"""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
    Usage,
)
from streamer.core.events import Event
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "search", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "mcp__docs",
        "tools": [{"type": "function", "name": "fetch", "parameters": {"type": "object"}}],
    },
    {"type": "custom", "name": "apply_patch"},
]
FLAT = ["search", "mcp__docs__fetch", "apply_patch", "unknown_tool"]

text = st.text(st.characters(codec="utf-8"), max_size=6)
deltas = st.one_of(
    st.builds(TextDelta, text),
    st.builds(ReasoningDelta, text),
    st.builds(RefusalDelta, text),
    st.builds(
        ToolCallDelta,
        index=st.integers(0, 2),
        id=st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
        name=st.one_of(st.none(), st.sampled_from(FLAT)),
        arguments=st.one_of(st.none(), text),
    ),
    st.builds(Finish, st.sampled_from(["stop", "length", "tool_calls"])),
    st.builds(Usage, st.integers(0, 9), st.integers(0, 9)),
)
# A turn is mostly tokens on the two per-token paths, with the other deltas mixed in.
turns = st.lists(
    st.one_of(
        deltas,
        st.builds(TextDelta, text),
        st.builds(ToolCallDelta, index=st.just(0), arguments=text),
    ),
    max_size=40,
)


def run(turn: list[Delta], cuts: list[int], limit: int, fast: bool) -> tuple[list[Event], Any]:
    with mock.patch("streamer.core.output.time.time", return_value=1_700_000_000.0):
        return _run(turn, cuts, limit, fast)  # one clock: the two runs may straddle a second


def _run(turn: list[Delta], cuts: list[int], limit: int, fast: bool) -> tuple[list[Event], Any]:
    counter = itertools.count()
    names = ResponsesToolNames.convert(TOOLS)
    response = new_response({"model": "m", "tools": TOOLS}, response_id="resp_1", created_at=1)
    streamer = OutputItemStreamer(
        names,
        response,
        make_id=lambda prefix: f"{prefix}_{next(counter)}",
        limits=OutputLimits(max_chars=limit, max_items=6),
    )
    streamer.per_token_paths = fast
    events = streamer.start()
    start = 0
    for cut in [*sorted(cuts), len(turn)]:
        events += streamer.feed(turn[start:cut])
        start = cut
    events += streamer.cut() if streamer.exceeded else streamer.finish()
    return events, response


@settings(max_examples=300, deadline=None)
@example(  # a live call's fragment with `arguments` None: found by this test
    [ToolCallDelta(0, name="search", arguments=None), ToolCallDelta(0, arguments="0"),  # type: ignore[arg-type]
     ToolCallDelta(0, arguments=None)],  # type: ignore[arg-type]
    [], 20, False,
)  # fmt: skip
@given(
    turns,
    st.lists(st.integers(0, 40), max_size=6),
    st.sampled_from([3, 20, 1 << 20]),
    st.booleans(),
)
def test_per_token_paths_make_the_same_events_as_the_handlers(
    turn: list[Delta], cuts: list[int], limit: int, fail: bool
) -> None:
    if fail:
        turn = [*turn, UpstreamError("server_error", "gone")]
    cuts = [min(c, len(turn)) for c in cuts]
    fast, fast_response = run(turn, cuts, limit, fast=True)
    plain, plain_response = run(turn, cuts, limit, fast=False)
    assert [tuple(e) for e in fast] == [tuple(e) for e in plain]
    assert all(type(e) is Event for e in fast)
    assert fast_response == plain_response
