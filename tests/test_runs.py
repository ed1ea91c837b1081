"""Runs of per-token chunks (decoder runs.py, `TextRun`/`ToolCallRun`, the streamer's run
paths) against the plain paths they replace (differential).

The decoder with runs on must give, piece for piece, the deltas it gives with runs off; the
streamer fed those runs must give the events the reference gives (runs off, every delta
through its handler): same types, same sequence numbers, the same JSON once parsed (a run's
pieces are spliced as the backend encoded them, not re-encoded), the same final response.
Streams are random, and hostile where it matters: escapes, quotes, backslashes, unicode,
`\\u2028`, surrogate pairs and lone ones, control characters, bad UTF-8, empty pieces,
chunks that look like the shape and are not, shapes that change mid-stream, `\\r\\n` line
ends and event names, reads split anywhere, output limits cut inside a run.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any
from unittest import mock

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamer.core import speed
from streamer.core.deltas import Delta, TextDelta, TextRun, ToolCallDelta, ToolCallRun, expand
from streamer.core.events import Event
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.chat.runs import strings
from streamer.upstream.chat.stream import ChatDecoder, EndCause

# -- strings(): sound on any bytes ------------------------------------------------------

_CONTENTS = re.compile(rb'(?:[^"\\]|\\.)*', re.DOTALL)  # one string literal's contents
HOSTILE = [
    b"", b"a", b'"', b'\\"', b"\\", b"a\\", b"\\\\", b"\\\\\\", b'\\\\"', b'a","b', b'","',
    b"\\n", b"\\u00e9", b"\\ud83d\\ude00", b"\\ud800", b"\\udc00x", b"\xed\xa0\x80", b"\xff",
    b"\xc3", b"\xe2\x80\xa8", b"\xf0\x9f\x98\x80", b"\t", b"\n", b"\r", b"\x00", b"\\/",
    b"\\x41", b"\\u12", b'\\"}', b"]", b"[", b",", b"1", b'"a"',
]  # fmt: skip
raw_pieces = st.one_of(
    st.sampled_from(HOSTILE),
    st.lists(st.sampled_from(HOSTILE), max_size=4).map(b"".join),
    st.binary(max_size=6),
    st.text(max_size=5).map(lambda t: orjson.dumps(t)[1:-1]),
    st.text(max_size=5).map(lambda t: json.dumps(t)[1:-1].encode()),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(raw_pieces, min_size=1, max_size=8))
def test_strings_decodes_only_pieces_that_are_each_one_string(pieces: list[bytes]) -> None:
    values = strings(pieces)
    if values is None:
        return
    assert len(values) == len(pieces)
    for piece, value in zip(pieces, values, strict=True):
        assert _CONTENTS.fullmatch(piece), piece  # a whole string literal's contents
        assert orjson.loads(b'"' + piece + b'"') == value


def test_pieces_that_join_into_strings_but_are_not_one_each_are_refused() -> None:
    # a trailing backslash escapes the join's quote: 'a",x' and 'y' from two bad pieces
    assert orjson.loads(b'["a\\",x","y"]') == ['a",x', "y"]
    assert strings([b"a\\", b'x","y']) is None
    # three pieces, three elements, but the middle ones are inside an object
    assert len(orjson.loads(b'["a",{"x":"u","v":"w","y":"z"},"b"]')) == 3
    assert strings([b'a",{"x":"u', b'v":"w', b'y":"z"},"b']) is None
    assert strings([b'a","b']) is None  # two strings from one piece
    assert strings([b"\\ud800"]) is None  # a lone surrogate
    assert strings([b"ok", b"\\u00e9", b"\\\\x", b'\\"']) == ["ok", "\u00e9", "\\x", '"']
    assert strings([b"ok", b"x\\\\"]) is None  # ends in an escaped backslash: the plain path


@given(st.lists(st.text(max_size=6), min_size=1, max_size=8))
def test_strings_takes_what_encoders_write(texts: list[str]) -> None:
    for encode in (lambda t: orjson.dumps(t)[1:-1], lambda t: json.dumps(t)[1:-1].encode()):
        pieces = [encode(t) for t in texts]
        if not any(p.endswith(b"\\") for p in pieces):  # a trailing escape: left to the plain path
            assert strings(pieces) == texts


# -- the decoder ------------------------------------------------------------------------

HEAD = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
TEXT = (HEAD + b'"delta":{"content":', b'},"logprobs":null,"finish_reason":null}]}')
ARGS = (HEAD + b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":', b"}}]}}]}")
START = HEAD + (
    b'"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",'
    b'"function":{"name":"search","arguments":""}}]}}]}'
)
OTHER = [
    HEAD + b'"delta":{"role":"assistant","content":""}}]}',
    START,
    HEAD + b'"delta":{"content":"x"},"logprobs":null,"finish_reason":"stop"}]}',
    HEAD.replace(b'"c"', b'"d"') + b'"delta":{"content":"new id"}}]}',  # another shape
    HEAD + b'"delta":{},"finish_reason":"length"}]}',
    b'{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}',
    b'{"error":{"message":"boom"}}',
    b"[DONE]",
    b"not json",
    HEAD + b'"delta":{"reasoning_content":"think"}}]}',  # a reasoning part: text opens another
]
texts = st.text(st.characters(codec="utf-8"), max_size=5) | st.sampled_from(
    ['"', "\\", "\u2028", "\U0001f600", "", "a\nb", "\x00", "é"]
)


def literal(text: str, how: int) -> bytes:
    return orjson.dumps(text) if how == 0 else json.dumps(text, ensure_ascii=how == 1).encode()


payloads = st.one_of(
    st.builds(lambda t, h: TEXT[0] + literal(t, h) + TEXT[1], texts, st.integers(0, 2)),
    st.builds(lambda t, h: ARGS[0] + literal(t, h) + ARGS[1], texts, st.integers(0, 2)),
    st.builds(lambda r: TEXT[0] + b'"' + r + b'"' + TEXT[1], raw_pieces),  # hostile contents
    st.builds(lambda r: ARGS[0] + b'"' + r + b'"' + ARGS[1], raw_pieces),
    st.builds(lambda r: TEXT[0] + r + TEXT[1], raw_pieces),  # fits the shape, no string
    st.sampled_from(OTHER),
)
# Mostly tokens, so runs form; the rest mixed in.
streams = st.lists(
    st.one_of(payloads, st.builds(lambda t: TEXT[0] + orjson.dumps(t) + TEXT[1], texts)),
    max_size=40,
)
framings = st.sampled_from(
    [b"data: %s\n\n", b"data: %s\n\n", b"data: %s\r\n\r\n", b"event: x\ndata: %s\n\n"]
)


def sse(stream: list[bytes], framing: list[bytes]) -> bytes:
    return b"".join(f % p for f, p in zip(itertools.cycle(framing), stream))


def decoded(body: bytes, cuts: list[int], runs: bool) -> list[list[Delta]]:
    """What the shell does: feed each read, take what waits, then end; per batch."""
    with speed.using("" if runs else "runs"):
        decoder = ChatDecoder()
    batches: list[list[Delta]] = []
    start = 0
    for cut in [*sorted(cuts), len(body)]:
        batches.append(decoder.feed(body[start:cut]))
        start = cut
        while decoder.pending:
            batches.append(decoder.take())
    batches.append(decoder.end(EndCause.CLEAN))
    return batches


@settings(max_examples=500, deadline=None)
@given(
    streams, st.lists(framings, min_size=1, max_size=3), st.lists(st.integers(0, 9000), max_size=4)
)
def test_runs_decode_piece_for_piece_what_the_plain_path_decodes(
    stream: list[bytes], framing: list[bytes], cuts: list[int]
) -> None:
    body = sse(stream + stream, framing)  # repeated: the shapes are learnt by the second half
    cuts = [min(c, len(body)) for c in cuts]
    fast = decoded(body, cuts, runs=True)
    plain = decoded(body, cuts, runs=False)
    assert [expand(b) for b in fast] == plain  # batch for batch, too
    for delta in (d for b in fast for d in b):
        if isinstance(delta, TextRun | ToolCallRun):
            assert len(delta.pieces) >= 2 and all(delta.pieces)
            assert "".join(delta.pieces) == (
                delta.text if isinstance(delta, TextRun) else delta.arguments
            )


def test_a_long_stream_decodes_in_runs() -> None:
    stream = [OTHER[0]] + [TEXT[0] + orjson.dumps(f"t{i} ") + TEXT[1] for i in range(600)]
    stream += [START] + [ARGS[0] + orjson.dumps(f"a{i}") + ARGS[1] for i in range(300)]
    body = sse([*stream, b"[DONE]"], [b"data: %s\n\n"])
    fast = [d for b in decoded(body, [], runs=True) for d in b]
    assert sum(isinstance(d, TextRun) for d in fast) >= 2  # a batch is 256 events at most
    assert sum(isinstance(d, ToolCallRun) for d in fast) >= 1
    assert expand(fast) == [d for b in decoded(body, [], runs=False) for d in b]


@given(st.integers(0, 4000))
def test_every_split_point_of_a_run(at: int) -> None:
    stream = [
        TEXT[0] + orjson.dumps(t) + TEXT[1]
        for t in ["a", "\u2028", "\U0001f600", 'q"', "\\", "é"] * 4
    ]
    body = sse(stream, [b"data: %s\n\n"])
    at = min(at, len(body))
    assert [expand(b) for b in decoded(body, [at], True)] == decoded(body, [at], False)


# -- the streamer -----------------------------------------------------------------------

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "search", "parameters": {"type": "object"}}
]


def events_of(body: bytes, cuts: list[int], limit: int, fast: bool) -> tuple[list[Any], Any]:
    counter = itertools.count()
    response = new_response({"model": "m", "tools": TOOLS}, response_id="resp_1", created_at=1)
    streamer = OutputItemStreamer(
        ResponsesToolNames.convert(TOOLS),
        response,
        make_id=lambda prefix: f"{prefix}_{next(counter)}",
        limits=OutputLimits(max_chars=limit, max_items=6),
    )
    streamer.per_token_paths = fast
    with mock.patch("streamer.core.output.time.time", return_value=1_700_000_000.0):
        events = streamer.start()
        for batch in decoded(body, cuts, runs=fast):
            events += streamer.feed(batch)
            if streamer.exceeded:
                break
        events += streamer.cut() if streamer.exceeded else streamer.finish()
    assert all(type(e) is Event for e in events)
    return [(e.type, orjson.loads(e.data), e.seq) for e in events], response


@settings(max_examples=400, deadline=None)
@example([TEXT[0] + orjson.dumps("abc") + TEXT[1]] * 5, [], 7)  # the limit inside a run
@example(  # a run whose first piece opens the text part, after a reasoning part
    [TEXT[0] + b'"a"' + TEXT[1], OTHER[-1], *[TEXT[0] + orjson.dumps(t) + TEXT[1] for t in "bcde"]],
    [],
    1 << 20,
)
@given(streams, st.lists(st.integers(0, 9000), max_size=3), st.sampled_from([5, 40, 1 << 20]))
def test_runs_make_the_events_the_reference_makes(
    stream: list[bytes], cuts: list[int], limit: int
) -> None:
    body = sse([OTHER[0], *stream, START, *stream, *stream], [b"data: %s\n\n"])
    cuts = [min(c, len(body)) for c in cuts]
    fast, fast_response = events_of(body, cuts, limit, fast=True)
    plain, plain_response = events_of(body, cuts, limit, fast=False)
    assert fast == plain
    assert [seq for _, _, seq in fast] == list(range(len(fast)))
    assert fast_response == plain_response


def test_every_piece_of_a_run_is_its_own_event() -> None:
    stream = [OTHER[0]] + [
        TEXT[0] + orjson.dumps(t) + TEXT[1] for t in ["a", "b\\", "c\u2028", "d"] * 50
    ]
    events, _ = events_of(sse(stream, [b"data: %s\n\n"]), [], 1 << 20, fast=True)
    deltas = [data["delta"] for kind, data, _ in events if kind == "response.output_text.delta"]
    assert deltas == ["a", "b\\", "c\u2028", "d"] * 50


# -- the other consumers of text and call deltas ---------------------------------------


def test_first_calls_and_the_compactor_take_a_run_as_its_pieces() -> None:
    from streamer.core.batch import Batch
    from streamer.core.compaction import Compactor
    from streamer.core.sealing import Sealer
    from streamer.upstream.first_call import FirstCallOnly

    def deltas(runs: bool) -> list[Delta]:
        run = [ToolCallRun(1, None, None, "ab", ["a", "b"], [b"a", b"b"])]
        text = [TextRun("xyz", ["x", "yz"], [b"x", b"yz"])]
        out: list[Delta] = [
            ToolCallDelta(0, "c0", "search", "{}"),
            ToolCallDelta(1, "c1", "search"),
        ]
        return out + (run + text if runs else expand(run + text))

    keep = FirstCallOnly(1)
    kept = expand(keep(Batch(deltas(True))))
    assert kept == FirstCallOnly(1)(Batch(deltas(False)))
    assert not any(isinstance(d, ToolCallDelta) and d.index == 1 for d in kept)
    for limit in (1, 2, 100):
        fast = Compactor(Sealer(b"k" * 32), "", limit)
        plain = Compactor(Sealer(b"k" * 32), "", limit)
        fast(Batch(deltas(True)))
        plain(Batch(deltas(False)))
        assert (fast.summary(), fast.exceeded) == (plain.summary(), plain.exceeded)


SECRETS = ("sk-test-KEY-0123456789", "other-secret")
piece_texts = st.sampled_from(
    ["a", "b ", "sk-", "test-", "KEY-0123", "456789", "oth", "er-secret", "sk", "x"]
)
plain_batches = st.lists(
    st.lists(
        st.one_of(
            st.builds(TextDelta, piece_texts),
            st.builds(lambda t: ToolCallDelta(0, None, None, t), piece_texts),
        ),
        max_size=8,
    ),
    max_size=6,
)


def grouped(batch: list[Delta], cuts: list[int]) -> list[Delta]:
    """Consecutive pieces of one kind made into runs, as the decoder would (2 or more)."""
    out: list[Delta] = []
    for delta in batch:
        last = out[-1] if out else None
        text = last.__class__ in (TextDelta, TextRun) and delta.__class__ is TextDelta
        args = last.__class__ in (ToolCallDelta, ToolCallRun) and delta.__class__ is ToolCallDelta
        if (text or args) and len(out) not in cuts:
            prior = expand([last])  # type: ignore[list-item]
            pieces = [*(p.text if text else p.arguments for p in prior)]  # type: ignore[union-attr]
            pieces.append(delta.text if text else delta.arguments)  # type: ignore[union-attr]
            raw = [orjson.dumps(p)[1:-1] for p in pieces]
            out[-1] = (
                TextRun("".join(pieces), pieces, raw)
                if text
                else ToolCallRun(0, None, None, "".join(pieces), pieces, raw)
            )
        else:
            out.append(delta)
    return out


def merged(deltas: list[Delta]) -> list[tuple[str, int, str]]:
    """The output as channels: consecutive pieces of one kind (and call) joined."""
    out: list[tuple[str, int, str]] = []
    for d in expand(deltas):
        key = (type(d).__name__, getattr(d, "index", -1))
        text = d.arguments if isinstance(d, ToolCallDelta) else d.text  # type: ignore[union-attr]
        if out and out[-1][:2] == key:
            out[-1] = (*key, out[-1][2] + text)
        else:
            out.append((*key, text))
    return out


@settings(max_examples=300, deadline=None)
@given(plain_batches, st.lists(st.integers(0, 8), max_size=3))
def test_redaction_takes_runs_as_their_pieces(batches: list[list[Delta]], cuts: list[int]) -> None:
    """Runs through the scrubber scrub as their plain pieces do, one by one."""
    from streamer.core.delta_scrub import DeltaScrubber

    def scrubbed(deltas_of: Any) -> list[Delta]:
        scrubber = DeltaScrubber(SECRETS)
        out: list[Delta] = []
        for batch in batches:
            out += scrubber.feed(deltas_of(batch))
        return out + scrubber.flush()

    def fresh(batch: list[Delta]) -> list[Delta]:  # deltas the scrubber may rewrite
        return [
            ToolCallDelta(0, None, None, d.arguments)
            if isinstance(d, ToolCallDelta)
            else TextDelta(d.text)
            for d in batch
        ]  # type: ignore[union-attr]

    runs = scrubbed(lambda b: grouped(fresh(b), cuts))
    assert merged(runs) == merged(scrubbed(fresh))
