"""A byte budget shared by every whole-JSON backend answer being read at once (pure).

A streamed answer is decoded as it comes and never held whole; a backend that answers
`stream: true` with one JSON body is held whole until decoded, so `BackendClient` takes
its bytes from this budget as they arrive and gives them back once the body is decoded.
One budget per process (`--max-backend-json-bytes`): ten hostile backends answering
100 MB each get one budget's worth between them, and the turns past it fail with a 503.
"""

from __future__ import annotations


class ByteBudget:
    """`take(n)` before holding n more bytes, `give(n)` after letting them go."""

    __slots__ = ("held", "limit", "peak", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (for tests and figures)
        self.refused = 0  # takes refused

    def take(self, n: int) -> bool:
        """Hold `n` more bytes if the budget has room; False (nothing taken) if not."""
        held = self.held + n
        if held > self.limit:
            self.refused += 1
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        return True

    def give(self, n: int) -> None:
        self.held -= n
