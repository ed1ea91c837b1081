"""What one WebSocket may hold across its lanes, and when a flooding client is cut (pure).

A socket's frames are held from the moment one is queued until its create has ended
(waiting in a lane or running: either way its parsed body is in memory). `QueueBudget`
bounds the frames and the bytes so held. The bytes are the frames' sizes as received:
the parsed frame is what stays in memory and the raw message length is a fair proxy for
it (orjson's objects are within a small factor of their JSON for the large strings that
make frames big), and it is known before parsing, so a rejected frame is never parsed.

A frame whose acceptance would exceed a bound is rejected: the shell answers it with an
`error` event and drops it. A client that goes on regardless, `max_rejected` rejected
frames in a row, is told to go away: the next rejection says CLOSE (the shell closes
1008). Any accepted frame resets the count, so a client that paces itself on its own
responses never gets there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

QUEUE_FULL = "websocket_queue_full"


class Admission(enum.Enum):
    ACCEPT = "accept"  # counted now; `release` it once its create has ended
    REJECT = "reject"  # answer with an error event, drop the frame
    CLOSE = "close"  # as REJECT, then close the socket (1008): the client does not stop


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
        """Why a frame of `size` bytes was rejected, for the client's error message."""
        if size > self.max_bytes:
            return (
                f"The message ({size} bytes) is larger than this connection may queue"
                f" ({self.max_bytes} bytes)."
            )
        return (
            f"Too much queued on this connection ({self.frames} frames, {self.bytes} bytes;"
            f" at most {self.max_frames} frames and {self.max_bytes} bytes): wait for"
            " responses to finish before sending more."
        )
