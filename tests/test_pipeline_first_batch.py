"""`stream_events`: the backend's first deltas leave with `response.created` when they are
already there, and the terminal event with the last deltas when the backend's end is in;
otherwise each waits for its own batch."""

from __future__ import annotations

from typing import Any

from streamer.core.batch import Batch
from streamer.core.deltas import Delta, Finish, TextDelta
from streamer.turns.turn import TurnOptions, prepare
from streamer.turns.turn_runner import stream_events


class ListStream:
    """An upstream stream over given batches; `ready`: the first one came with the backend's
    head (`first`); `end_with_last`: the last batch says it is the end (the end of the body
    came with it), else the stream just stops after it."""

    def __init__(self, batches: list[list[Delta]], ready: bool, end_with_last: bool) -> None:
        self.batches = [
            Batch(b, end=end_with_last and i == len(batches) - 1) for i, b in enumerate(batches)
        ]
        # ready with nothing to say: the head's bytes completed no delta, nor the end
        self.first = (self.batches.pop(0) if self.batches else Batch()) if ready else None
        self.closed = False

    def __aiter__(self) -> ListStream:
        return self

    async def __anext__(self) -> Batch:
        if not self.batches:
            raise StopAsyncIteration
        return self.batches.pop(0)

    async def aclose(self) -> None:
        self.closed = True


class ListUpstream:
    def __init__(self, stream: ListStream) -> None:
        self.stream = stream

    async def open(self, backend_request: dict[str, Any], **_: Any) -> ListStream:
        return self.stream


async def batches(
    ready: bool, deltas: list[list[Delta]], end_with_last: bool = False
) -> tuple[list[list[str]], ListStream]:
    turn = prepare({"model": "m", "input": "hi"}, TurnOptions())
    stream = ListStream(deltas, ready, end_with_last)
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


async def test_the_end_rides_with_the_last_deltas_when_it_is_in() -> None:
    out, _ = await batches(False, [[TextDelta("a")], [TextDelta("b"), Finish("stop")]], True)
    assert out[0] == ["response.created", "response.in_progress"]
    assert out[-1][0] == "response.output_text.delta"
    assert out[-1][-1] == "response.completed"
    assert len(out) == 3


async def test_a_whole_answer_in_the_first_read_is_one_batch() -> None:
    out, _ = await batches(True, [[TextDelta("a"), Finish("stop")]], True)
    assert len(out) == 1
    assert out[0][0] == "response.created" and out[0][-1] == "response.completed"


class BrokenStream(ListStream):
    """A stream whose first read fails with a bug of the gateway's own."""

    async def __anext__(self) -> list[Delta]:
        raise RuntimeError("a bug")


async def test_a_failure_in_the_first_read_still_sends_created_first() -> None:
    turn = prepare({"model": "m", "input": "hi"}, TurnOptions())
    stream = BrokenStream([], ready=False, end_with_last=False)
    out = [[e.type for e in b] async for b in stream_events(turn, ListUpstream(stream))]
    # the first batch is a value now (`first`): a read that fails is never part of the first write
    assert [t for b in out for t in b] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert stream.closed
