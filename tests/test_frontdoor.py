"""The front door's rules over plain values: who waits, who is evicted, who times out."""

from __future__ import annotations

import orjson

from streamer.frontends.frontdoor import Door, timeout_reply
from streamer.frontends.http import fresh


def test_under_the_cap_everyone_is_admitted() -> None:
    door: Door[str] = Door(capacity=3, header_timeout=10)
    assert [door.accept(c, 0).admitted for c in "abc"] == [True, True, True]
    assert door.open == 3 and door.waiting == 3
    assert door.stats.accepted == 3 and door.stats.evicted == 0


def test_at_the_cap_the_longest_waiter_is_evicted() -> None:
    door: Door[str] = Door(capacity=2, header_timeout=10)
    door.accept("a", 0)
    door.accept("b", 1)
    door.heard("a")
    decision = door.accept("c", 2)
    assert decision.admitted and decision.evicted == "a" and decision.evicted_partial
    assert door.open == 2 and door.stats.evicted == 1


def test_busy_connections_are_never_evicted() -> None:
    door: Door[str] = Door(capacity=2, header_timeout=10)
    door.accept("old", 0)
    door.accept("young", 1)
    door.begin("old")  # its head arrived: serving a request or a stream
    assert door.accept("new", 2).evicted == "young"
    door.begin("new")
    refused = door.accept("late", 3)  # every slot busy: nobody to evict
    assert not refused.admitted and refused.evicted is None
    assert door.stats.refused == 1 and door.open == 2


def test_a_kept_alive_connection_waits_again_from_the_end_of_its_response() -> None:
    door: Door[str] = Door(capacity=2, header_timeout=10)
    door.accept("kept", 0)
    door.accept("fresh", 5)
    door.begin("kept")
    door.end("kept", 7)  # now it has waited since 7, less than "fresh" (since 5)
    assert door.accept("new", 8).evicted == "fresh"
    assert door.next_deadline() == 17


def test_the_header_deadline_counts_from_accept_or_the_last_response() -> None:
    door: Door[str] = Door(capacity=10, header_timeout=10)
    door.accept("a", 0)
    door.accept("b", 3)
    door.accept("c", 4)
    door.begin("c")
    assert door.next_deadline() == 10
    assert door.expired(9.9) == []
    assert door.expired(13) == ["a", "b"]
    assert door.stats.timed_out == 2 and door.open == 1
    door.end("c", 20)
    assert door.expired(29) == [] and door.expired(30) == ["c"]
    assert door.next_deadline() is None


def test_only_a_begun_head_is_answered_408() -> None:
    door: Door[str] = Door(capacity=10, header_timeout=10)
    door.accept("idle", 0)
    door.accept("slow", 0)
    door.heard("slow")
    assert door.partial("slow") and not door.partial("idle")
    door.begin("slow")
    door.end("slow", 1)
    assert not door.partial("slow")  # the next head has not begun


def test_a_closed_connection_frees_its_slot_and_later_calls_are_no_ops() -> None:
    door: Door[str] = Door(capacity=1, header_timeout=10)
    door.accept("a", 0)
    door.begin("a")
    door.close("a")
    door.end("a", 1)  # the handler finishes after the client left
    door.begin("a")
    assert door.open == 0
    assert door.accept("b", 2).admitted and door.stats.evicted == 0


def test_timeout_reply_is_a_whole_408_in_openai_shape() -> None:
    raw = timeout_reply("too slow")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"Connection: close" in head and f"Content-Length: {len(body)}".encode() in head
    error = orjson.loads(body)["error"]
    assert error == {
        "message": "too slow",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_timeout",
    }


def test_readyz_probe_freshness() -> None:
    assert not fresh(None, 5, 2)
    assert fresh(10, 11.9, 2)
    assert not fresh(10, 12, 2)
    assert not fresh(10, 10, 0)  # 0: never cached
