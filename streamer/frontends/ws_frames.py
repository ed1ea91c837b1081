"""WebSocket text frames from the server, several at once (RFC 6455 §5.2; pure).

A turn's events leave a socket as one message each. Framed one by one by the WebSocket
library, each is a write of its own: a system call and a wake-up of the reader per
event, which on loopback cost more than the rest of the gateway's work on the event.
Framed here, a batch of events is one buffer and one write. Frames from a server are
never masked; only uncompressed messages can be framed this way (a socket that
negotiated permessage-deflate frames through the library).

A lane's events carry its `stream_id`: `with_stream_id` adds it to each event's JSON
object, whatever spacing the encoder used.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import orjson

_FIN_TEXT = 0x81  # FIN, no RSV bits, opcode 1 (text)
_short = struct.Struct("!BB").pack
_medium = struct.Struct("!BBH").pack
_long = struct.Struct("!BBQ").pack
_SPACE = frozenset((b" ", b"\t", b"\n", b"\r"))  # JSON's whitespace


def text_frames(messages: Iterable[bytes]) -> bytes:
    """Each message (UTF-8 text) as one final, unmasked text frame, all in one buffer."""
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        n = len(message)
        if n < 126:
            append(_short(_FIN_TEXT, n))
        elif n < 65536:
            append(_medium(_FIN_TEXT, 126, n))
        else:
            append(_long(_FIN_TEXT, 127, n))
        append(message)
    return b"".join(parts)


def with_stream_id(messages: Iterable[bytes], stream_id: str) -> list[bytes]:
    """Each message (a JSON object) with `"stream_id": <stream_id>` as its last member.

    Spliced, not re-encoded (an event may hold a whole response); only the object's
    closing brace is relied on, so any valid JSON object works, the empty one included.
    """
    member = b'"stream_id":%s}' % orjson.dumps(stream_id)
    tail = b"," + member
    out: list[bytes] = []
    for message in messages:
        body = message if message.endswith(b"}") else message.rstrip()  # JSON allows spaces
        if not body.endswith(b"}"):
            raise ValueError("a WebSocket event must be a JSON object")
        head = body[:-1]
        last = head[-1:]
        if last in _SPACE:
            last = head.rstrip()[-1:]
        out.append(head + (member if last == b"{" else tail))  # "{}": no member before ours
    return out
