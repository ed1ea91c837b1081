"""The pure parts of secret scrubbing, owners and backend headers, with plain values.

`StreamScrubber` against every way of cutting a text in three; `scrub_message` on cut-off
keys; `_RedactingStream` over a fake stream (channels, flush on finish and at the end);
`rate_limit_headers`; the memory store's owners.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
)
from streamer.redact import REDACTED, StreamScrubber, _RedactingStream, scrub_message, secrets_of
from streamer.store import MemoryStore, StoredResponse
from streamer.upstream.batch import Batch
from streamer.upstream.chat.http_errors import http_error, rate_limit_headers

KEY = "sk-test-KEY-0123456789"
OTHER = "sk-other-999999"
SECRETS = secrets_of((KEY, OTHER))


def scrub_all(pieces: list[str]) -> str:
    scrubber = StreamScrubber(SECRETS)
    return "".join(scrubber.feed(piece) for piece in pieces) + scrubber.flush()


@pytest.mark.parametrize(
    "text",
    [f"the key is {KEY}.", f"{KEY}{KEY}", f"sss {OTHER} sk-tes", f"s{KEY}k", "no secret, is sk"],
)
def test_every_cut_in_three_scrubs_like_the_whole(text: str) -> None:
    expected = text.replace(KEY, REDACTED).replace(OTHER, REDACTED)
    for a, b in itertools.combinations(range(1, len(text)), 2):
        assert scrub_all([text[:a], text[a:b], text[b:]]) == expected, (a, b)


def test_only_a_possible_start_is_held_and_a_long_one_is_redacted_at_the_end() -> None:
    scrubber = StreamScrubber(SECRETS)
    assert scrubber.feed("hello sk-te") == "hello "
    assert scrubber.held == "sk-te"
    assert scrubber.feed("a") == "sk-tea"  # not a key after all: all of it goes on
    assert scrubber.feed("the end: sk-test-KEY") == "the end: "
    assert scrubber.flush() == REDACTED  # the stream stopped 12 characters into a key


def test_bytes_with_fragments_for_recordings() -> None:
    raw = tuple(s.encode() for s in SECRETS)
    scrubber: StreamScrubber[bytes] = StreamScrubber(raw, fragments=True)
    out = scrubber.feed(b'{"a":"' + KEY[:10].encode()) + scrubber.feed(KEY[10:].encode() + b'"}')
    out += scrubber.feed(b"half: " + KEY[5:17].encode() + b" end") + scrubber.flush()
    assert out == b'{"a":"[redacted]"}half: [redacted] end'


def test_scrub_message_removes_cut_off_keys() -> None:
    assert scrub_message(f"bad key {KEY[:12]}", SECRETS) == "bad key [redacted]"
    assert scrub_message(f"...{KEY[-9:]} was sent", SECRETS) == "...[redacted] was sent"
    assert scrub_message(f"short {KEY[:7]}", SECRETS) == f"short {KEY[:7]}"  # below 8: kept


def test_http_error_scrubs_the_key_before_cutting() -> None:
    body = ("x" * 495 + KEY).encode()
    exc = http_error(500, body, {}, (KEY,))
    assert KEY[:5] not in exc.message
    assert exc.message.endswith("x" * 5 + REDACTED[:5])


class FakeStream:
    """Batches as an upstream hands them over: nothing with the head, the last one `end`."""

    first = None

    def __init__(self, batches: list[list[Delta]]) -> None:
        self.batches = batches

    async def __anext__(self) -> Batch:
        if not self.batches:
            raise StopAsyncIteration
        return Batch(self.batches.pop(0), end=not self.batches)

    async def aclose(self) -> None:
        pass


async def run(batches: list[list[Delta]]) -> list[Delta]:
    stream = _RedactingStream(FakeStream(batches), SECRETS)
    out: list[Delta] = []
    last = None
    async for batch in stream:
        out += batch
        last = batch
    assert last is None or last.end  # the end, and the tail held back, came in the last batch
    return out


async def test_a_key_across_deltas_and_channels() -> None:
    out = await run(
        [
            [TextDelta("key: sk-te"), TextDelta("st-KEY-01")],
            [TextDelta("23456789 ok"), ReasoningDelta("sk-")],
            [ToolCallDelta(0, "c", "f", '{"k":"sk-test'), ToolCallDelta(0, None, None, '-KEY-0123456789"}')],
            [ToolCallDelta(1, None, None, "sk-oth")],
            [Finish("stop")],
        ]
    )  # fmt: skip
    texts = "".join(d.text for d in out if isinstance(d, TextDelta))
    assert texts == "key: [redacted] ok"
    assert [d.text for d in out if isinstance(d, ReasoningDelta)] == ["sk-"]  # flushed on switch
    args = {i: "".join(d.arguments for d in out if isinstance(d, ToolCallDelta) and d.index == i) for i in (0, 1)}  # fmt: skip
    assert args == {0: '{"k":"[redacted]"}', 1: "sk-oth"}
    assert isinstance(out[-1], Finish)


async def test_the_held_tail_comes_out_at_the_end_and_failures_are_scrubbed() -> None:
    out = await run([[TextDelta("bye sk")]])
    assert [d.text for d in out] == ["bye ", "sk"]  # type: ignore[union-attr]
    out = await run([[TextDelta("a")], [UpstreamError("bad", f"echo {KEY[:15]}")]])
    assert out[-1] == UpstreamError("bad", "echo [redacted]")


def test_rate_limit_headers_keep_only_legal_values() -> None:
    headers: dict[str, Any] = {
        "Retry-After": "1\x01",
        "retry-after-ms": "250",
        "x-ratelimit-limit": "10 , 20",
        "x-ratelimit-bad": " 1",
        "x-ratelimit-long": "9" * 300,
        "x-ratelimit-(x)": "1",
        "other": "x",
    }
    assert rate_limit_headers(headers) == {"retry-after-ms": "250", "x-ratelimit-limit": "10 , 20"}


async def test_memory_store_owners() -> None:
    store = MemoryStore()
    await store.put(StoredResponse({"id": "resp_a"}, [{"type": "message"}], "alice"))
    await store.put(StoredResponse({"id": "resp_open"}, [], None))
    assert await store.get_response("resp_a", owner="bob") is None
    assert await store.get("resp_a", owner="bob") is None
    assert await store.input_items("resp_a", owner="bob") is None
    assert await store.delete("resp_a", owner="bob") is False
    record = await store.get("resp_a", owner="alice")
    assert record is not None and record.owner == "alice"
    assert await store.get_response("resp_a") is not None  # the gateway itself sees it
    assert await store.get_response("resp_open", owner="bob") is not None
    assert await store.delete("resp_a", owner="alice") is True
