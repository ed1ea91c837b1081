"""`Gateway.run(turn, sink)`: one turn lifecycle for every transport, over a fake sink.

The sink records what it is sent and what the store holds at each send, so the tests
see the order of storing and sending, not only the end state. No sockets: the upstream
is a list of batches (tests/test_pipeline_first_batch.py's `ListUpstream`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import pytest
from test_pipeline_first_batch import ListStream, ListUpstream

from streamer.config import Settings
from streamer.core.deltas import Delta, Finish, TextDelta
from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.frontends.background import Background
from streamer.store import MemoryStore
from streamer.turns.gateway import Gateway, never
from streamer.turns.in_flight import Stop
from streamer.turns.registry import Backend, UpstreamRegistry
from streamer.turns.turn import Turn

ANSWER: list[list[Delta]] = [[TextDelta("a")], [TextDelta("b")], [Finish("stop")]]


class RecordingSink:
    """Each batch's event types, whether it was `final`, and whether the store had the
    response when the batch was sent."""

    def __init__(self, store: MemoryStore, turn: Turn, answered: bool = True) -> None:
        self.store = store
        self.response_id = turn.response["id"]
        self.answered = answered
        self.sent: list[tuple[list[str], bool, bool]] = []
        self.got_any = asyncio.Event()
        self.got_text = asyncio.Event()  # a text delta went out

    async def send(self, batch: list[Event], final: bool) -> None:
        stored = await self.store.get_response(self.response_id) is not None
        kinds = [e.type for e in batch]
        self.sent.append((kinds, final, stored))
        self.got_any.set()
        if "response.output_text.delta" in kinds:
            self.got_text.set()


class RefusingUpstream:
    async def open(self, backend_request: dict[str, Any], **_: Any) -> Any:
        raise RequestError("The backend said no.", status=429, code="rate_limit_exceeded")


class HeldStream(ListStream):
    """Gives its first batch, then waits until cancelled (a slow backend)."""

    async def __anext__(self) -> list[Delta]:
        if self.batches:
            return self.batches.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def gateway(upstream: Any) -> tuple[Gateway, MemoryStore]:
    store = MemoryStore()
    background = Background(store, store_wait=0.0, cancel_wait=0.1)
    registry = UpstreamRegistry(cast(Backend, upstream))
    return Gateway(Settings(), registry, store, background), store


async def a_turn(gw: Gateway, **body: Any) -> Turn:
    return await gw.prepare({"model": "m", "input": "hi", **body}, client="")


async def test_every_batch_reaches_the_sink_in_order_and_only_the_last_is_final() -> None:
    gw, store = gateway(ListUpstream(ListStream([*ANSWER], ready=False, end_with_last=False)))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    await gw.run(turn, sink, "sse")
    kinds = [k for batch, _, _ in sink.sent for k in batch]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 2
    assert [final for _, final, _ in sink.sent] == [False] * (len(sink.sent) - 1) + [True]


async def test_the_response_is_stored_before_its_last_batch_is_sent() -> None:
    gw, store = gateway(ListUpstream(ListStream([*ANSWER], ready=False, end_with_last=False)))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    await gw.run(turn, sink, "json")
    assert [stored for _, _, stored in sink.sent] == [False] * (len(sink.sent) - 1) + [True]
    record = await store.get(turn.response["id"])
    assert record is not None and record.response["status"] == "completed"


async def test_store_false_and_keep_never_store_nothing() -> None:
    for body, keep in (({"store": False}, None), ({}, never)):
        gw, store = gateway(ListUpstream(ListStream([*ANSWER], False, False)))
        turn = await a_turn(gw, **body)
        sink = RecordingSink(store, turn)
        if keep is None:
            await gw.run(turn, sink, "sse")
        else:
            await gw.run(turn, sink, "sse", keep=keep)
        assert sink.sent[-1][1] is True  # the turn ended
        assert await store.get(turn.response["id"]) is None


async def test_a_refusal_before_any_event_raises_with_nothing_sent() -> None:
    gw, store = gateway(RefusingUpstream())
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    with pytest.raises(RequestError) as refused:
        await gw.run(turn, sink, "sse")
    assert refused.value.code == "rate_limit_exceeded"
    assert sink.sent == []
    assert await store.get(turn.response["id"]) is None


async def test_the_shutdown_deadline_ends_a_drained_turn_failed_and_stored() -> None:
    stream = HeldStream([[TextDelta("a")]], ready=False, end_with_last=False)
    gw, store = gateway(ListUpstream(stream))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)

    task = asyncio.create_task(gw.run(turn, sink, "sse"))  # run enters the registry
    await sink.got_text.wait()
    await gw.in_flight.drain(asyncio.get_running_loop().time())  # the deadline is now
    await task  # the cut was absorbed: the turn returns normally
    last_kinds, final, was_stored = sink.sent[-1]
    assert final and last_kinds[-1] == "response.failed" and was_stored
    assert turn.response["status"] == "failed"
    assert stream.closed  # the backend was let go


async def test_the_shutdown_deadline_before_any_answer_is_a_503() -> None:
    stream = HeldStream([], ready=False, end_with_last=False)
    gw, store = gateway(ListUpstream(stream))
    turn = await a_turn(gw)

    class Unanswered(RecordingSink):
        async def send(self, batch: list[Event], final: bool) -> None:
            await RecordingSink.send(self, batch, final)
            await asyncio.Event().wait()  # the first write never finishes: nothing answered

    slow = Unanswered(store, turn, answered=False)  # SSE before its head: an HTTP error

    task = asyncio.create_task(gw.run(turn, slow, "sse"))  # run enters the registry
    await slow.got_any.wait()
    await gw.in_flight.drain(asyncio.get_running_loop().time())
    with pytest.raises(RequestError) as refused:
        await task
    assert refused.value.status == 503 and refused.value.code == "server_shutting_down"
    assert [final for _, final, _ in slow.sent] == [False]  # only the write that hung
    assert await store.get(turn.response["id"]) is None


async def test_a_cancel_that_is_not_the_drain_propagates() -> None:
    stream = HeldStream([[TextDelta("a")]], ready=False, end_with_last=False)
    gw, store = gateway(ListUpstream(stream))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    task = asyncio.create_task(gw.run(turn, sink, "websocket"))
    await sink.got_text.wait()
    task.cancel()  # the socket closed, say: not the registry's stop
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.closed
    assert not any(final for _, final, _ in sink.sent)


async def test_a_refused_turn_whose_client_holds_it_ends_failed() -> None:
    gw, store = gateway(RefusingUpstream())
    turn = await a_turn(gw)
    turn.streamer.queued()  # a background turn: the client was answered `queued`
    sink = RecordingSink(store, turn)
    await gw.run(turn, sink, "background")
    kinds = ["response.created", "response.in_progress", "response.failed"]
    assert sink.sent == [(kinds, True, True)]  # stored, then sent as the last batch
    assert turn.response["error"]["code"] == "rate_limit_exceeded"


async def test_a_stop_for_a_cancel_ends_the_turn_cancelled_and_stored() -> None:
    stream = HeldStream([[TextDelta("a")]], ready=False, end_with_last=False)
    gw, store = gateway(ListUpstream(stream))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    task = asyncio.create_task(gw.run(turn, sink, "background"))
    await sink.got_text.wait()
    gw.in_flight.stop(task, Stop.CANCEL)
    await task  # the cancel was the registry's: the turn returns normally
    last_kinds, final, was_stored = sink.sent[-1]
    assert final and last_kinds[-1] == "response.failed" and was_stored
    assert turn.response["status"] == "cancelled" and turn.response["error"] is None
    record = await store.get(turn.response["id"])
    assert record is not None and record.response["status"] == "cancelled"
    assert stream.closed


async def test_a_held_turn_is_drained_before_its_task_runs() -> None:
    gw, store = gateway(ListUpstream(ListStream([*ANSWER], ready=False, end_with_last=False)))
    turn = await a_turn(gw)
    sink = RecordingSink(store, turn)
    task = asyncio.create_task(gw.run(turn, sink, "background"))
    gw.in_flight.hold(task)  # as a background turn is, when accepted
    assert len(gw.in_flight) == 1  # before the task has even started
    await gw.in_flight.drain(asyncio.get_running_loop().time() + 60)
    assert task.done() and len(gw.in_flight) == 0
    assert sink.sent[-1][0][-1] == "response.completed"  # the grace let it finish


class Streams:
    """An upstream that answers each request with the next of its streams."""

    def __init__(self, *streams: ListStream) -> None:
        self.streams = list(streams)

    async def open(self, backend_request: dict[str, Any], **_: Any) -> ListStream:
        return self.streams.pop(0)


async def test_the_drain_waits_for_turns_that_start_during_the_grace() -> None:
    """A turn that starts once the drain began (a WebSocket lane's queued create) is
    drained too; past the deadline, one that would start is refused with a 503."""
    held = HeldStream([[TextDelta("a")]], ready=False, end_with_last=False)
    gw, store = gateway(Streams(held, ListStream([*ANSWER], ready=False, end_with_last=False)))
    first, later = await a_turn(gw), await a_turn(gw)
    first_sink, later_sink = RecordingSink(store, first), RecordingSink(store, later)
    running = asyncio.create_task(gw.run(first, first_sink, "websocket"))
    await first_sink.got_text.wait()
    drain = asyncio.create_task(gw.in_flight.drain(asyncio.get_running_loop().time() + 60))
    await gw.run(later, later_sink, "websocket")  # starts while the drain waits
    assert later_sink.sent[-1][0][-1] == "response.completed"
    assert not drain.done()  # the first turn still runs
    running.cancel()  # the socket closed, say: the turn just goes
    with pytest.raises(asyncio.CancelledError):
        await running
    async with asyncio.timeout(10):
        await drain  # no turn left: the drain is over
    gw.in_flight.cut = True  # as past the deadline
    with pytest.raises(RequestError) as refused:
        await gw.run(await a_turn(gw), RecordingSink(store, later), "websocket")
    assert refused.value.status == 503 and refused.value.code == "server_shutting_down"


async def test_a_stop_whose_cancel_was_lost_is_asked_for_again() -> None:
    """On Python 3.11 `asyncio.wait_for` (redis-py's) can swallow a cancel: the turn runs
    on, and the registry's stop must still reach it."""
    stream = HeldStream([[TextDelta("a")], [TextDelta("b")]], ready=False, end_with_last=False)
    gw, store = gateway(ListUpstream(stream))
    turn = await a_turn(gw)
    writing = asyncio.Event()

    class Swallowing(RecordingSink):
        async def send(self, batch: list[Event], final: bool) -> None:
            await RecordingSink.send(self, batch, final)
            if self.got_text.is_set() and not final and not writing.is_set():
                writing.set()
                with contextlib.suppress(asyncio.CancelledError):  # as wait_for's race does
                    await asyncio.Event().wait()

    sink = Swallowing(store, turn)
    task = asyncio.create_task(gw.run(turn, sink, "background"))
    await writing.wait()
    gw.in_flight.stop(task, Stop.CANCEL)  # lands in the write, and is lost there
    done, _ = await asyncio.wait({task}, timeout=10)  # (a timeout around `await task`
    assert done == {task}  # would cancel the task itself)
    await task  # the stop was asked for again, and taken: the turn returned
    assert task.cancelling() == 0  # the lost cancel was taken back too
    assert sink.sent[-1][0][-1] == "response.failed" and turn.response["status"] == "cancelled"
