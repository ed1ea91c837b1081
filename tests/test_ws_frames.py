"""`text_frames` frames messages exactly as aiohttp's own WebSocket writer does, one by one."""

from __future__ import annotations

from typing import Any

from aiohttp import WSMsgType
from aiohttp._websocket.writer import WebSocketWriter

from streamer.frontends.ws_frames import text_frames

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
