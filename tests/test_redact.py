"""The pure parts of secret scrubbing, owners and backend headers, with plain values.

`PieceScrubber` and `StreamScrubber` against every way of cutting a text in three, and
against the same pieces with other characters (what leaves, and when, depends on lengths
only: no partial match is an oracle); `excerpt` on cut-off keys; the backend's error words
scrubbed where they enter (`http_error`, `payload_error`); `DeltaScrubber` and
`_RedactingStream` over a fake stream (channels, flush on finish and at the end);
`rate_limit_headers`; the memory store's owners.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.core.batch import Batch
from streamer.core.delta_scrub import DeltaScrubber
from streamer.core.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamError,
)
from streamer.core.scrub import (
    REDACTED,
    TOKEN,
    WINDOW_FLOOR,
    StreamScrubber,
    excerpt,
    secrets_of,
)
from streamer.store import MemoryStore, StoredResponse
from streamer.upstream.chat.decoder import payload_error
from streamer.upstream.chat.http_errors import http_error, rate_limit_headers
from streamer.upstream.redact import _RedactingStream

KEY = "sk-test-KEY-0123456789"
OTHER = "sk-other-999999"
SECRETS = secrets_of((KEY, OTHER))


def pieces_through(pieces: list[str], secrets: tuple[str, ...] = SECRETS) -> list[list[str]]:
    """The texts of the deltas `DeltaScrubber` lets go after each piece, and at the end."""
    scrubber = DeltaScrubber(secrets)
    out = [scrubber.feed([TextDelta(piece)]) for piece in pieces] + [scrubber.flush()]
    return [[d.text for d in batch] for batch in out]  # type: ignore[union-attr]


def stream_through(pieces: list[str]) -> list[str]:
    scrubber = StreamScrubber(SECRETS)
    return [scrubber.feed(piece) for piece in pieces] + [scrubber.flush()]


@pytest.mark.parametrize(
    "text",
    [f"the key is {KEY}.", f"{KEY}{KEY}", f"sss {OTHER} sk-tes", f"s{KEY}k", "no secret, is sk"],
)
def test_every_cut_in_three_scrubs_like_the_whole(text: str) -> None:
    expected = text.replace(KEY, REDACTED).replace(OTHER, REDACTED)
    for a, b in itertools.combinations(range(1, len(text)), 2):
        cut = [text[:a], text[a:b], text[b:]]
        released = pieces_through(cut)
        assert "".join(itertools.chain(*released)) == expected, (a, b)
        assert sum(map(len, released)) <= 3  # one delta out for each in (none for a key's end)
        assert "".join(stream_through(cut)) == expected, (a, b)


def test_a_piece_leaves_once_the_window_has_followed_it_and_the_end_lets_all_go() -> None:
    window = DeltaScrubber(SECRETS).window
    assert window == WINDOW_FLOOR > len(KEY)  # the same for every key up to that length
    assert DeltaScrubber(secrets_of(("k" * 400,))).window == 399
    pieces = ["hello-", "sk-te", "a" * (window - 5), "x" * 5]  # one token: no cut in it
    assert pieces_through(pieces) == [[], [], ["hello-"], ["sk-te"], ["a" * (window - 5), "x" * 5]]
    # a start of a key, not a key: as it came, when the stream ends
    assert pieces_through([f"the end: {KEY[:12]}"]) == [[], [f"the end: {KEY[:12]}"]]


def test_what_waits_is_the_open_token_run_at_most_the_window() -> None:
    pieces = ["Hello", " wor", "ld", "!", "x" * 30, "sk-te", "st-KEY-0123456789 ok"]
    assert pieces_through(pieces) == [
        [],
        ["Hello"],  # a space ends a token: no key spans it
        [],
        [" wor", "ld", "!"],
        [],
        [],  # a long run: a key may start anywhere in it
        ["x" * 30, REDACTED],
        [" ok"],
    ]
    odd = secrets_of(("key with spaces",))  # not a token: the whole window waits
    assert pieces_through(["Hello", " world, and more"], odd) == [
        [],
        [],
        ["Hello", " world, and more"],  # the end lets all go
    ]


key_text = st.text(alphabet="sk-testKEY0123456789 x.!", max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(key_text, min_size=1, max_size=8),
    st.sampled_from(TOKEN),
    st.sampled_from(' !"{},:\n'),
)
def test_what_leaves_and_when_depends_on_lengths_only(
    pieces: list[str], token: str, other: str
) -> None:
    """The same pieces with every token character replaced by another, every other character
    by another: the same pieces leave after the same feeds, unless the text holds a whole
    secret (which is what is taken out). Nothing depends on how far a text matches a key."""
    if any(s in "".join(pieces) for s in SECRETS):
        return
    plain = ["".join(token if c in TOKEN else other for c in p) for p in pieces]

    def shape(released: list[list[str]]) -> list[list[int]]:
        return [[len(p) for p in out] for out in released]

    assert shape(pieces_through(pieces)) == shape(pieces_through(plain))
    assert list(map(len, stream_through(pieces))) == list(map(len, stream_through(plain)))
    assert "".join(stream_through(pieces)) == "".join(pieces)  # nothing taken out


def test_bytes_with_runs_of_a_key_taken_out_for_recordings() -> None:
    raw = tuple(s.encode() for s in SECRETS)
    scrubber: StreamScrubber[bytes] = StreamScrubber(raw, fragments=True)
    out = scrubber.feed(b'{"a":"' + KEY[:10].encode()) + scrubber.feed(KEY[10:].encode() + b'"}')
    out += scrubber.feed(b"half: " + KEY[5:17].encode() + b" end") + scrubber.flush()
    assert out == b'{"a":"[redacted]"}half: [redacted] end'


def test_an_excerpt_is_scrubbed_before_it_is_cut() -> None:
    text = "x" * 10 + KEY + " rest"
    assert excerpt(text, 15, SECRETS) == "x" * 10 + REDACTED[:5]
    assert excerpt(text.encode(), 15, SECRETS) == b"x" * 10 + REDACTED[:5].encode()
    assert excerpt(f"bad key {KEY[:12]}", 100, SECRETS) == f"bad key {KEY[:12]}"  # no key


def test_http_error_scrubs_the_key_before_cutting() -> None:
    body = ("x" * 495 + KEY).encode()
    exc = http_error(500, body, {}, (KEY,))
    assert KEY[:5] not in exc.message
    assert exc.message.endswith("x" * 5 + REDACTED[:5])


def test_the_backends_words_are_scrubbed_and_the_gateways_defaults_kept() -> None:
    said = {"error": {"message": f"key {KEY} revoked", "code": KEY, "type": "x", "param": OTHER}}
    exc = http_error(400, orjson.dumps(said), {}, SECRETS)
    assert (exc.message, exc.code, exc.param) == (f"key {REDACTED} revoked", REDACTED, REDACTED)
    refused = http_error(
        401, orjson.dumps({"error": {"message": "Incorrect key sk-te****6789"}}), {}, SECRETS
    )
    assert "sk-te" not in refused.message and refused.message.startswith("The backend refused")
    assert payload_error({"error": {"message": f"no {KEY}", "code": OTHER}}, SECRETS) == (
        UpstreamError(REDACTED, f"no {REDACTED}")
    )
    # a secret that is a word of the gateway's own defaults leaves them alone
    words = secrets_of(("server_error", "The backend reported an error."))
    assert payload_error({"error": {}}, words) == (
        UpstreamError("server_error", "The backend reported an error.")
    )


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
    texts = [d.text for d in out if isinstance(d, TextDelta)]
    assert texts == ["key: [redacted]", " ok"]  # the delta that held only key is gone
    assert [d.text for d in out if isinstance(d, ReasoningDelta)] == ["sk-"]  # flushed on switch
    args = {i: [d.arguments for d in out if isinstance(d, ToolCallDelta) and d.index == i] for i in (0, 1)}  # fmt: skip
    assert args == {0: ['{"k":"[redacted]', '"}'], 1: ["sk-oth"]}
    assert isinstance(out[-1], Finish)


async def test_deltas_leave_as_the_backend_cut_them_and_errors_as_they_came() -> None:
    out = await run([[TextDelta("bye "), TextDelta("sk")]])
    assert out == [TextDelta("bye "), TextDelta("sk")]  # a start of a key: no cut, no marker
    error = UpstreamError("bad", f"echo {KEY[:15]}")  # scrubbed where it entered, if at all
    out = await run([[TextDelta("a")], [error]])
    assert out == [TextDelta("a"), error]


def test_the_scrubber_holds_deltas_whole_and_bounded() -> None:
    scrubber = DeltaScrubber(SECRETS)
    start = ToolCallDelta(0, "call", "f", "")
    assert scrubber.feed([start]) == [start]  # nothing waits before it: it leaves at once
    out = scrubber.feed([ToolCallDelta(0, None, None, "ab")])
    out += scrubber.feed([ToolCallDelta(0, "again", None, "") for _ in range(1000)])
    assert out == [] and len(scrubber._held) == 2  # empty ones fold into one
    assert [d.arguments for d in scrubber.flush()] == ["ab", ""]  # type: ignore[union-attr]


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
