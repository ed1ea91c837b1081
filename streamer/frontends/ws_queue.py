"""What one WebSocket may hold across its lanes, and when a flooding client is cut (pure).

A socket's frames are held from the moment one is queued until its create has ended
(waiting in a lane or running: either way its parsed body is in memory). `QueueBudget`
bounds the frames and the bytes so held. A frame is charged what it costs once parsed
(`frame_cost`), worked out from its text before parsing, so a frame over the bound is
refused before the parse is paid for. What it costs is not its size: `[{},{},…]` is
3 bytes of text per item and 72 bytes of Python objects (an empty dict and the list's
pointer to it), so charging the text let a socket hold ~24x its bound (issue 25, row 3).

`frame_cost` is an upper bound, from one count per character kind: the text itself
(every parsed string's characters come out of it), plus a fixed charge for each
character that can start an object, a list, a string or a value, each the most CPython
spends on what it starts (see `_CHARGES`; `tests/test_ws_queue.py` checks the bound
against the measured size of the parsed objects over generated JSON). Ordinary frames,
mostly text, are charged 1-5x their size; a frame of tiny items ~60x.

A frame whose acceptance would exceed a bound is rejected: the shell answers it with an
`error` event and drops it. A client that goes on regardless, `max_rejected` rejected
frames in a row, is told to go away: the next rejection says CLOSE (the shell closes
1008). Any accepted frame resets the count, so a client that paces itself on its own
responses never gets there.
"""

from __future__ import annotations

import enum
import re
import sys
from dataclasses import dataclass

QUEUE_FULL = "websocket_queue_full"

# What each character that starts something may cost once parsed, beyond its text, in
# bytes (CPython 3.11, 64-bit, orjson). `{`: a dict of up to five keys is 184 bytes,
# with `"` `"` `:` of its first key; `[`: a list is 56, its first element's pointer 8
# and a number 28; `"`: a string's header (49 bytes ASCII, up to 76) is its two quotes'
# and the `,` `:` or `[` before it; `,` and `:`: the next value's pointer and a number
# object (a number past 2**30 has the digits to pay for its size) or a dict entry.
_CHARGES = (("{", 144), ("[", 96), ('"', 24), (",", 40), (":", 40))
_CHARGES_B = tuple((char.encode(), charge) for char, charge in _CHARGES)
_WIDEST = 4  # bytes per character of a string holding any character beyond U+FFFF
_HEAD = 80  # the root value, which no character before it pays for (a str's own header)
# an escape past U+00FF, `\u0100` to `\uffff` (a `\\u` that is none is charged as one)
_WIDENING = re.compile(r"\\u(?!00)")
_WIDENING_B = re.compile(rb"\\u(?!00)")


class Admission(enum.Enum):
    ACCEPT = "accept"  # counted now; `release` it once its create has ended
    REJECT = "reject"  # answer with an error event, drop the frame
    CLOSE = "close"  # as REJECT, then close the socket (1008): the client does not stop


def frame_cost(raw: str | bytes) -> int:
    """What a frame may hold once parsed, in bytes: an upper bound, from its text alone.

    Its characters count at the width the parsed strings can take: a str's own (1, 2 or
    4 bytes, as `sys.getsizeof` says), or the widest when an escape (`\\u0100` and up)
    or, in a binary frame, a non-ASCII byte can make a string wider than its text.
    """
    if isinstance(raw, bytes):
        starts = sum(raw.count(char) * charge for char, charge in _CHARGES_B)
        narrow = raw.isascii() and _WIDENING_B.search(raw) is None
        return (len(raw) if narrow else _WIDEST * len(raw)) + _HEAD + starts
    starts = sum(raw.count(char) * charge for char, charge in _CHARGES)
    narrow = _WIDENING.search(raw) is None  # Latin-1 escapes (\u00XX) widen nothing
    return (sys.getsizeof(raw) if narrow else _WIDEST * len(raw) + _HEAD) + starts


@dataclass(slots=True)
class QueueBudget:
    """Frames and bytes one socket holds (queued or running), against its bounds."""

    max_bytes: int
    max_frames: int
    max_rejected: int  # rejections in a row allowed; the next one closes
    frames: int = 0
    bytes: int = 0
    rejected: int = 0  # rejections since the last accepted frame

    def offer(self, size: int) -> Admission:
        """Take a frame of `size` bytes if both bounds allow it; else say what to do."""
        if self.frames + 1 <= self.max_frames and self.bytes + size <= self.max_bytes:
            self.frames += 1
            self.bytes += size
            self.rejected = 0
            return Admission.ACCEPT
        self.rejected += 1
        return Admission.CLOSE if self.rejected > self.max_rejected else Admission.REJECT

    def release(self, size: int) -> None:
        """An accepted frame of `size` bytes is done with (its create ended or was dropped)."""
        self.frames = max(self.frames - 1, 0)
        self.bytes = max(self.bytes - size, 0)

    def clear(self) -> None:
        self.frames = self.bytes = self.rejected = 0

    def describe(self, size: int) -> str:
        """Why a frame charged `size` bytes was rejected, for the client's error message."""
        if size > self.max_bytes:
            return (
                f"The message (up to {size} bytes once parsed) is larger than this"
                f" connection may queue ({self.max_bytes} bytes)."
            )
        return (
            f"Too much queued on this connection ({self.frames} frames, {self.bytes} bytes;"
            f" at most {self.max_frames} frames and {self.max_bytes} bytes): wait for"
            " responses to finish before sending more."
        )
