"""`parallel_tool_calls: false` enforced by the gateway (pure): keep the first call only.

llama.cpp's grammar ignores the flag (2-4 calls came back, issue 15), and a backend whose
profile drops the parameter never sees it: the first call the backend starts is kept, the
fragments of any other call are left out before the `OutputItemStreamer` sees them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from streamer.core.deltas import ToolCallDelta
from streamer.upstream.batch import Batch


class FirstCallOnly:
    """Filters batches down to the first tool call's fragments (by `index`, then `id`)."""

    __slots__ = ("closed", "id", "index")

    def __init__(self) -> None:
        self.index: int | None = None
        self.id: str | None = None
        self.closed = False  # a second call came at the first one's index (Ollama: all at 0)

    def __call__(self, batch: Batch) -> Batch:
        if not any(isinstance(d, ToolCallDelta) for d in batch):
            return batch
        return Batch([d for d in batch if self.keep(d)], end=batch.end)

    def keep(self, delta: object) -> bool:
        if not isinstance(delta, ToolCallDelta):
            return True
        if self.closed:
            return False
        if self.index is None:
            self.index, self.id = delta.index, delta.id
            return True
        if delta.index != self.index:
            return False  # another call; the first may still go on (interleaving backends)
        if delta.id is not None and self.id is not None and delta.id != self.id:
            self.closed = True  # a new call reusing the index: it and all later ones go
            return False
        self.id = self.id or delta.id
        return True


def first_call_only(
    next_batch: Callable[[], Awaitable[Batch]], first: Batch | None
) -> tuple[Callable[[], Awaitable[Batch]], Batch | None]:
    """A stream's reader and first batch, filtered to the first call (`FirstCallOnly`)."""
    keep = FirstCallOnly()

    async def filtered() -> Batch:
        return keep(await next_batch())

    return filtered, (None if first is None else keep(first))
