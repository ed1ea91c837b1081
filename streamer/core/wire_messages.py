"""Lowered messages that keep the bytes of their earlier part (pure).

A conversation's lowered messages change only at their end from one turn to the next: a
turn that continues one (streamer/turns/history_reuse.py) resumes the lowering where the last
turn left it, and its earlier messages need not be encoded again either. `Encoded` holds
the JSON of a run of messages as a few blobs, each the comma-joined encodings of the
messages one turn added; `LoweredMessages` is the message list as everything reads it (a
plain list of dicts), with the blobs beside it: `body_pieces` gives the bytes `orjson.dumps`
would (tests/test_history_reuse.py holds them to it) as pieces a socket takes in one
vectored write, the blobs never copied.

The messages of a lowered request are never changed once made (they are shared by the turns
that resume from them); anything appended after lowering (a compaction's handover prompt)
is encoded as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

MAX_BLOBS = 32  # past this many, the blobs are joined into one (a long session's turns)


@dataclass(frozen=True, slots=True)
class Encoded:
    """The JSON of the first `count` messages of a list, as blobs (see the module)."""

    count: int = 0
    blobs: tuple[bytes, ...] = ()
    size: int = 0  # bytes in the blobs

    def extend(self, messages: Sequence[dict[str, Any]]) -> Encoded:
        """These bytes and the messages `messages[self.count:]` after them."""
        new = messages[self.count :]
        if not new:
            return self
        blob = orjson.dumps(list(new))[1:-1]  # the elements, without the brackets
        blobs = (*self.blobs, blob)
        if len(blobs) > MAX_BLOBS:
            blobs = (b",".join(blobs),)
        return Encoded(len(messages), blobs, self.size + len(blob))


class LoweredMessages(list[dict[str, Any]]):
    """A lowered request's messages (a list of message dicts), with their wire form: the
    first `encoded.count` messages after `lead` as their bytes; `state`, when kept, is
    where a later turn resumes the lowering (core/chat_messages.py)."""

    __slots__ = ("encoded", "lead", "state")

    def __init__(
        self,
        messages: list[dict[str, Any]],
        lead: int,
        encoded: Encoded,
        state: Any = None,
        rest: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(messages)
        self.extend(rest)  # `messages + rest`, copied once
        self.lead = lead  # messages before the encoded ones (the leading system message)
        self.encoded = encoded
        self.state = state

    def pieces(self) -> list[bytes] | None:
        """The JSON array as pieces to join; None when the list is no longer the one
        lowered (shorter)."""
        lead, encoded = self.lead, self.encoded
        if len(self) < lead + encoded.count:
            return None
        before, after = self[:lead], self[lead + encoded.count :]
        out = [b"["]
        if before:
            out += (orjson.dumps(before)[1:-1], b",")
        for blob in encoded.blobs:
            out += (blob, b",")
        if after:
            out.append(orjson.dumps(after)[1:-1])
        elif encoded.blobs or before:
            out.pop()  # the last comma
        out.append(b"]")
        return out


def encode_body(body: Mapping[str, Any]) -> bytes:
    """`orjson.dumps(body)`, the earlier messages of lowered ones as their kept bytes."""
    pieces = body_pieces(body)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


SMALL = 4096  # pieces shorter than this are joined with their neighbours


def body_pieces(body: Mapping[str, Any]) -> list[bytes]:
    """The bytes of `orjson.dumps(body)`, in pieces: the kept blobs of lowered messages (a
    Chat body's `messages`, a Responses body's `input`) as they are (a socket takes them in
    one vectored write, never copied into one buffer), the short pieces between them
    joined; one piece for any other body."""
    name = lowered_key(body)
    pieces = body[name].pieces() if name is not None else None
    if name is None or pieces is None:
        return [orjson.dumps(body)]
    keys = list(body)
    at = keys.index(name)
    head = orjson.dumps({k: body[k] for k in keys[:at]})[:-1]  # `{...` without its `}`
    tail = orjson.dumps({k: body[k] for k in keys[at + 1 :]})[1:]  # `...}` without `{`
    key = b'"%s":' % name.encode() if at == 0 else b',"%s":' % name.encode()
    return _joined_small([head, key, *pieces, b"," if len(tail) > 1 else b"", tail])


LOWERED_KEYS = ("messages", "input")  # where a kind's lowering puts its list (Chat, Responses)


def lowered_key(body: Mapping[str, Any]) -> str | None:
    """The key of the body's `LoweredMessages`, if it has one."""
    for name in LOWERED_KEYS:
        if body.get(name).__class__ is LoweredMessages:
            return name
    return None


def _joined_small(parts: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    small: list[bytes] = []
    for part in parts:
        if len(part) < SMALL:
            small.append(part)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(part)
    if small:
        out.append(b"".join(small))
    return out
