"""`stream_events`: the backend's first deltas leave with `response.created` when they are
already there, and only then."""

from __future__ import annotations

from typing import Any

from streamer.deltas import Delta, Finish, TextDelta
from streamer.pipeline import TurnOptions, prepare, stream_events


class ListStream:
    """An upstream stream over given batches; `ready` as a backend's head arrives with or
    without its first body bytes."""

    def __init__(self, batches: list[list[Delta]], ready: bool) -> None:
        self.batches = batches
        self.ready = ready
        self.closed = False

    def __aiter__(self) -> ListStream:
        return self

    async def __anext__(self) -> list[Delta]:
        if not self.batches:
            raise StopAsyncIteration
        return self.batches.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class ListUpstream:
    def __init__(self, stream: ListStream) -> None:
        self.stream = stream

    async def open(self, chat_request: dict[str, Any], **_: Any) -> ListStream:
        return self.stream


async def batches(ready: bool, deltas: list[list[Delta]]) -> tuple[list[list[str]], ListStream]:
    turn = prepare({"model": "m", "input": "hi"}, TurnOptions())
    stream = ListStream(deltas, ready)
    out = [[e.type for e in batch] async for batch in stream_events(turn, ListUpstream(stream))]
    return out, stream


async def test_first_deltas_already_there_ride_with_created() -> None:
    out, stream = await batches(True, [[TextDelta("a"), TextDelta("b")], [Finish("stop")]])
    assert out[0] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
    ]
    assert out[-1][-1] == "response.completed"
    assert stream.closed


async def test_created_leaves_alone_while_the_backend_has_sent_nothing() -> None:
    out, _ = await batches(False, [[TextDelta("a")], [Finish("stop")]])
    assert out[0] == ["response.created", "response.in_progress"]
    assert out[1][-1] == "response.output_text.delta"


async def test_a_ready_stream_that_ends_at_once_still_completes() -> None:
    out, _ = await batches(True, [])
    assert out == [["response.created", "response.in_progress"], ["response.completed"]]
