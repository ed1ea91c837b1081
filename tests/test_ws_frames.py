"""`text_frames` frames messages exactly as aiohttp's own WebSocket writer does, one by one;
`with_stream_id` adds a lane's id to any JSON object event."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from aiohttp import WSMsgType
from aiohttp._websocket.writer import WebSocketWriter
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.frontends.ws_frames import text_frames, with_stream_id

SIZES = [0, 1, 125, 126, 127, 65535, 65536, 200_000]


class Collect:
    """A transport that keeps what it is given."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: Any) -> None:
        self.data += bytes(data)

    def is_closing(self) -> bool:
        return False


class Protocol:
    _paused = False


async def library_frames(messages: list[bytes]) -> bytes:
    transport = Collect()
    writer = WebSocketWriter(Protocol(), transport, use_mask=False)  # type: ignore[arg-type]
    for message in messages:
        await writer.send_frame(message, WSMsgType.TEXT)
    return transport.data


async def test_frames_are_the_librarys_byte_for_byte() -> None:
    messages = [b'{"n":"%s"}' % (b"x" * max(0, size - 8)) for size in SIZES]
    messages = [m[:size] if size < 8 else m for m, size in zip(messages, SIZES, strict=True)]
    assert text_frames(messages) == await library_frames(messages)


def test_no_messages_no_bytes() -> None:
    assert text_frames([]) == b""


# -- a lane's events carry its stream_id ---------------------------------------------------

TEXT = st.lists(
    st.one_of(st.text(max_size=5), st.sampled_from(['"', "\\", "}", "{", "😀", "\x00"])),
    max_size=4,
).map("".join)
OBJECTS = st.dictionaries(
    TEXT.filter(lambda k: k != "stream_id"),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), TEXT, st.lists(TEXT, max_size=2)),
    max_size=4,
)
ENCODERS = st.sampled_from(
    [
        orjson.dumps,
        lambda v: json.dumps(v).encode(),
        lambda v: json.dumps(v, indent=2).encode() + b" \n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(objects=st.lists(OBJECTS, max_size=4), encode=ENCODERS, lane=TEXT)
def test_each_event_gains_the_stream_id_whatever_its_spacing(
    objects: list[dict[str, Any]], encode: Any, lane: str
) -> None:
    messages = with_stream_id([encode(o) for o in objects], lane)
    assert [orjson.loads(m) for m in messages] == [{**o, "stream_id": lane} for o in objects]


@given(objects=st.lists(OBJECTS.filter(bool), max_size=4), lane=TEXT)
def test_the_gateways_events_get_the_bytes_they_always_got(
    objects: list[dict[str, Any]], lane: str
) -> None:
    encoded = [orjson.dumps(o) for o in objects]
    tail = b',"stream_id":%s}' % orjson.dumps(lane)
    assert with_stream_id(encoded, lane) == [data[:-1] + tail for data in encoded]


def test_only_json_objects_can_carry_a_stream_id() -> None:
    for message in [b"[]", b'"x"', b""]:
        with pytest.raises(ValueError):
            with_stream_id([message], "lane")
