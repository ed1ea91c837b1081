"""The WebSocket session rules (streamer/frontends/ws_session.py), with plain values.

Frame checks, lanes, the queue budget and remembered responses (least recently used,
each lane's latest pinned), without a socket or an event loop.
"""

from __future__ import annotations

import sys

import orjson

from streamer.frontends.ws_queue import Admission, QueueBudget, frame_cost
from streamer.frontends.ws_session import MAX_LANES, Refused, SessionRules


def rules(remember: int = 100, max_frames: int = 10, max_bytes: int = 10_000) -> SessionRules:
    return SessionRules(QueueBudget(max_bytes, max_frames, 2), remember)


def create(**fields: object) -> bytes:
    return orjson.dumps({"type": "response.create", "model": "m", **fields})


def refused_code(result: object) -> str | None:
    assert isinstance(result, Refused), result
    return result.error.code


# -- frame checks -----------------------------------------------------------------------


def test_a_create_passes_and_names_its_lane() -> None:
    session = rules()
    frame = session.check(create(stream_id="a", input="hi"))
    assert isinstance(frame, dict) and frame["input"] == "hi"
    assert session.named == {"a"}


def test_frames_that_are_not_creates_are_refused_with_their_codes() -> None:
    session = rules()
    assert refused_code(session.check(b"{not json")) == "invalid_json"
    assert refused_code(session.check(b"[1, 2]")) == "invalid_event"
    assert refused_code(session.check(b'{"model": "m"}')) == "unsupported_event_type"
    other = session.check(orjson.dumps({"type": "response.cancel", "stream_id": "b"}))
    assert refused_code(other) == "unsupported_event_type"
    assert isinstance(other, Refused) and other.lane == "b"  # answered on its lane
    assert session.named == set()  # no refused frame names a lane


def test_an_invalid_stream_id_is_refused_off_any_lane() -> None:
    session = rules()
    for lane in ("", "a b", "x" * 257, 7):
        result = session.check(create(stream_id=lane))
        assert refused_code(result) == "invalid_stream_id"
        assert isinstance(result, Refused) and result.lane is None


def test_at_most_max_lanes_named_lanes_and_known_ones_stay_open() -> None:
    session = rules()
    for n in range(MAX_LANES):
        assert isinstance(session.check(create(stream_id=f"l{n}")), dict)
    over = session.check(create(stream_id="one-more"))
    assert refused_code(over) == "websocket_stream_limit_reached"
    assert isinstance(over, Refused) and over.lane == "one-more"
    assert isinstance(session.check(create(stream_id="l0")), dict)  # a known lane
    assert isinstance(session.check(create()), dict)  # the default lane does not count


def test_a_closing_session_refuses_every_create() -> None:
    session = rules()
    session.closing = True
    assert refused_code(session.check(create(stream_id="a"))) == "server_shutting_down"


# -- budget and lanes -------------------------------------------------------------------


def test_offer_charges_the_frame_what_it_holds_once_parsed() -> None:
    session = rules(max_frames=1)
    raw = create(input="x" * 100)
    cost = frame_cost(raw)
    assert cost > len(raw)  # its objects as well as its text
    assert session.offer(raw) == (Admission.ACCEPT, cost)
    assert session.offer(raw) == (Admission.REJECT, cost)  # one frame at most
    text = raw.decode()
    assert frame_cost(text) > sys.getsizeof(text)  # a str: its own size, header included


def test_the_first_frame_on_a_lane_asks_for_a_worker_the_next_ones_queue() -> None:
    session = rules()
    first = session.check(create(stream_id="a", input="1"))
    second = session.check(create(stream_id="a", input="2"))
    assert isinstance(first, dict) and isinstance(second, dict)
    queue = session.enqueue(first, 10)
    assert queue is not None and list(queue) == [(first, 10)]
    assert session.enqueue(second, 20) is None  # the worker will get to it
    assert list(queue) == [(first, 10), (second, 20)]
    queue.clear()
    session.lane_idle("a", queue)
    assert session.queues == {}
    assert session.enqueue(first, 10) is not None  # a new worker for a new frame


def test_an_old_queue_going_idle_leaves_a_newer_one_alone() -> None:
    session = rules()
    frame = session.check(create())
    assert isinstance(frame, dict)
    old = session.enqueue(frame, 1)
    assert old is not None
    del session.queues[None]  # as if that worker ended and a new frame came
    new = session.enqueue(frame, 1)
    session.lane_idle(None, old)
    assert session.queues == {None: new}


# -- remembered responses ---------------------------------------------------------------


def history(n: int) -> tuple[dict[str, object], ...]:
    return ({"type": "message", "role": "user", "content": str(n)},)


def test_recall_gives_the_history_and_makes_it_most_recent() -> None:
    session = rules(remember=2)
    session.remember("r1", None, history(1))
    session.remember("r2", None, history(2))
    assert session.recall("r1") == history(1)
    assert session.recall("missing") is None
    session.remember("r3", None, history(3))
    assert list(session.remembered) == ["r1", "r3"]  # r2 was least recently used


def test_each_lanes_latest_is_forgotten_last() -> None:
    session = rules(remember=2)
    session.remember("a1", "a", history(1))
    session.remember("b1", "b", history(2))
    session.remember("b2", "b", history(3))
    # a1 is oldest, but it is lane a's latest: b1 goes first
    assert list(session.remembered) == ["a1", "b2"]
    session.remember("c1", "c", history(4))  # every one a lane's latest: oldest goes
    assert list(session.remembered) == ["b2", "c1"]


def test_a_limit_of_zero_remembers_nothing() -> None:
    session = rules(remember=0)
    session.remember("r1", None, history(1))
    assert list(session.remembered) == []


def test_evict_forgets_a_parent_on_its_own_lane_only() -> None:
    session = rules()
    session.remember("p", "a", history(1))
    session.evict("p", "b")  # a fork from another lane failed: the parent stays
    assert "p" in session.remembered
    session.evict(None, "a")
    session.evict("p", "a")
    assert "p" not in session.remembered


def test_clear_drops_everything() -> None:
    session = rules()
    frame = session.check(create(stream_id="a"))
    assert isinstance(frame, dict)
    session.offer(create())
    session.enqueue(frame, 1)
    session.remember("r", "a", history(1))
    session.clear()
    assert (session.remembered, session.queues, session.named) == ({}, {}, set())
    assert (session.budget.frames, session.budget.bytes) == (0, 0)
