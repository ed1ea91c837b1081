"""Logprobs (issue 17): asked of the backend, decoded from its stream, carried on
`response.output_text.delta` / `.done` and the output_text parts in OpenAI's shape; the
decoder unit, the streamer unit, and end to end with the official SDK."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, Status, chunk, completion, finish, usage
from sdk_models import validate_event
from test_tap_record import tap

from streamer.core.deltas import Finish, LoggedText, TextDelta
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.tap.replay import Recording, normalised, replay
from streamer.upstream.chat.decoder import ChatChunkDecoder, decode_completion
from streamer.upstream.chat.logprobs import choice_logprobs


def _entry(token: str, logprob: float, *alternatives: tuple[str, float]) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives
        ],
    }


def logged_chunk(text: str, *entries: dict[str, Any], role: bool = False) -> dict[str, Any]:
    """A text chunk whose choice carries `logprobs.content` (vLLM, llama.cpp, OpenAI)."""
    delta: dict[str, Any] = {"content": text}
    if role:
        delta["role"] = "assistant"
    body = chunk(delta)
    body["choices"][0]["logprobs"] = {"content": list(entries)}
    return body


HEL = _entry("Hel", -0.25, ("Hel", -0.25), ("Hi", -1.5))
LO = _entry("lo", -0.5, ("lo", -0.5), ("p", -2.0))
BANG = _entry("!", -0.0625, ("!", -0.0625), (".", -3.0))
SCRIPT = [
    logged_chunk("Hel", HEL, role=True),
    logged_chunk("lo", LO),
    logged_chunk("!", BANG),
    finish("stop"),
    usage(4, 3),
    DONE,
]


def _brief(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as the delta/done events carry it: whole, `bytes` included (Open Responses
    requires them; the SDK's `Logprob` has no such field and ignores it)."""
    return entry


# -- decoding -----------------------------------------------------------------------------


def test_the_decoder_carries_a_chunks_logprobs_on_its_text() -> None:
    decoder = ChatChunkDecoder()
    out = decoder.decode([orjson.dumps(c) for c in SCRIPT[:3]])
    assert out == [LoggedText("Hel", [HEL]), LoggedText("lo", [LO]), LoggedText("!", [BANG])]


def test_a_learnt_text_shape_never_loses_logprobs() -> None:
    """Plain chunks teach the decoder a per-token shape; a chunk with logprobs after them
    still decodes to text with logprobs (the shape's slice does not match it)."""
    decoder = ChatChunkDecoder()
    plain = [orjson.dumps(chunk({"content": t})) for t in ("a", "b", "c")]
    out = decoder.decode([*plain, orjson.dumps(logged_chunk("d", _entry("d", -1.0)))])
    assert out[:3] == [TextDelta("a"), TextDelta("b"), TextDelta("c")]
    assert out[3] == LoggedText("d", [_entry("d", -1.0)])


def test_entries_are_normalised_and_bad_ones_left_out() -> None:
    choice = {
        "logprobs": {
            "content": [
                {"token": "é", "logprob": -1, "bytes": None, "top_logprobs": None},
                {"token": "x"},  # no logprob
                "junk",
                {"token": "y", "logprob": -2.5, "bytes": [300], "top_logprobs": [{"token": 1}]},
            ]
        }
    }
    assert choice_logprobs(choice) == [
        {"token": "é", "logprob": -1.0, "bytes": [0xC3, 0xA9], "top_logprobs": []},
        {"token": "y", "logprob": -2.5, "bytes": [121], "top_logprobs": []},
    ]
    assert choice_logprobs({"logprobs": None}) == []
    assert choice_logprobs({"logprobs": {"content": None, "refusal": []}}) == []


def test_a_whole_completion_carries_its_logprobs() -> None:
    body = completion("Hello")
    body["choices"][0]["logprobs"] = {"content": [HEL, LO]}
    deltas = decode_completion(body)
    assert deltas[0] == LoggedText("Hello", [HEL, LO])


# -- the streamer -------------------------------------------------------------------------


def _streamer() -> OutputItemStreamer:
    names = ResponsesToolNames.convert([])
    return OutputItemStreamer(names, new_response({"model": "m"}), make_id=lambda p: f"{p}_1")


def test_the_streamer_puts_logprobs_on_deltas_done_and_the_part() -> None:
    streamer = _streamer()
    streamer.start()
    # plain text between logged text: its delta carries [] (the per-token path)
    events = streamer.feed([LoggedText("Hel", [HEL]), TextDelta("lo"), LoggedText("!", [BANG])])
    events += streamer.finish()
    decoded = [orjson.loads(e.data) for e in events]
    for event in events:
        validate_event(event.data)
    deltas = [e for e in decoded if e["type"] == "response.output_text.delta"]
    assert [(d["delta"], d["logprobs"]) for d in deltas] == [
        ("Hel", [_brief(HEL)]),
        ("lo", []),
        ("!", [_brief(BANG)]),
    ]
    (done,) = [e for e in decoded if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == [_brief(HEL), _brief(BANG)]
    part = streamer.response["output"][0]["content"][0]
    assert part["text"] == "Hello!"
    assert part["logprobs"] == [HEL, BANG]


def test_without_logprobs_the_parts_carry_an_empty_list() -> None:
    streamer = _streamer()
    streamer.start()
    events = streamer.feed([TextDelta("a"), TextDelta("b")]) + streamer.finish()
    assert all(b'"logprobs":[]' in e.data for e in events if b"output_text." in e.data)
    assert streamer.response["output"][0]["content"][0]["logprobs"] == []


# -- end to end ---------------------------------------------------------------------------


async def test_logprobs_end_to_end_with_the_sdk() -> None:
    async with GatewayHarness() as gw, AsyncOpenAI(base_url=gw.url, api_key="k") as sdk:
        gw.backend.script(SCRIPT, SCRIPT)
        stream = await sdk.responses.create(
            model="m",
            input="hi",
            top_logprobs=2,
            include=["message.output_text.logprobs"],
            stream=True,
        )
        events = [e async for e in stream]
        whole = await sdk.responses.create(model="m", input="hi", top_logprobs=2)
    for body in gw.backend.requests:
        assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [d.delta for d in deltas] == ["Hel", "lo", "!"]
    first = deltas[0].logprobs[0]
    assert (first.token, first.logprob) == ("Hel", -0.25)
    assert [(t.token, t.logprob) for t in first.top_logprobs or []] == [
        ("Hel", -0.25),
        ("Hi", -1.5),
    ]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.token for lp in done.logprobs] == ["Hel", "lo", "!"]
    for response in (events[-1].response, whole):  # type: ignore[union-attr]
        part = response.output[0].content[0]  # type: ignore[union-attr]
        assert part.text == "Hello!"
        assert [(lp.token, lp.bytes) for lp in part.logprobs] == [
            ("Hel", list(b"Hel")),
            ("lo", list(b"lo")),
            ("!", list(b"!")),
        ]
        assert math.isclose(sum(lp.logprob for lp in part.logprobs), -0.8125)
        assert response.top_logprobs == 2


async def test_a_backend_that_ignores_stream_still_gives_logprobs() -> None:
    body = completion("Hello")
    body["choices"][0]["logprobs"] = {"content": [HEL, LO]}
    async with GatewayHarness() as gw, AsyncOpenAI(base_url=gw.url, api_key="k") as sdk:
        gw.backend.script([Status(200, body)])
        response = await sdk.responses.create(model="m", input="hi", top_logprobs=1)
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert [lp.token for lp in part.logprobs] == ["Hel", "lo"]  # type: ignore[union-attr]


async def test_a_secret_in_logged_text_is_scrubbed_and_its_tokens_left_out() -> None:
    """Text with logprobs is an output channel like any text: a configured key the backend
    echoes is scrubbed, and the logprobs of the pieces scrubbed or held (their tokens would
    spell the key) are left out."""
    from test_redact import KEY, run

    out = await run(
        [
            [LoggedText("fine ", [_entry("fine ", -1.0)])],
            [LoggedText(KEY[:10], [_entry(KEY[:10], -1.0)])],
            [LoggedText(KEY[10:] + " end", [_entry(KEY[10:], -1.0), _entry(" end", -1.0)])],
            [Finish("stop")],
        ]
    )
    texts = [d for d in out if isinstance(d, TextDelta)]
    assert "".join(d.text for d in texts) == "fine [redacted] end"
    tokens = "".join(lp["token"] for d in texts if isinstance(d, LoggedText) for lp in d.logprobs)
    assert tokens == "fine "


async def test_a_recording_with_logprobs_passes_the_tap_and_replays_the_same(
    tmp_path: Path,
) -> None:
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(tap_dir=str(tap_dir)) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        gw.backend.script(SCRIPT)
        stream = await sdk.responses.create(model="m", input="hi", top_logprobs=2, stream=True)
        events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    (path,) = tap_dir.iterdir()
    status, output = await tap(path)
    assert status == 0, output
    recording = Recording.load(str(path))
    replayed = [orjson.loads(e.data) for e in await replay(recording)]
    assert normalised(replayed) == normalised(recording.events)
    part = recording.events[-1]["response"]["output"][0]["content"][0]
    assert [lp["token"] for lp in part["logprobs"]] == ["Hel", "lo", "!"]
