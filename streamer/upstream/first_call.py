"""`parallel_tool_calls: false` and `max_tool_calls` enforced by the gateway (pure): keep
the first calls only.

llama.cpp's grammar ignores the flag (2-4 calls came back, issue 15), a backend whose
profile drops the parameter never sees it, and no Chat backend knows a call limit: the
first `limit` calls the backend starts are kept, the fragments of any other call are left
out before the `OutputItemStreamer` sees them (OpenAI ignores calls past `max_tool_calls`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from streamer.core.batch import Batch
from streamer.core.deltas import ToolCallDelta


class FirstCallOnly:
    """Filters batches down to the first `limit` tool calls' fragments (by `index`, then `id`)."""

    __slots__ = ("closed", "ids", "limit")

    def __init__(self, limit: int = 1) -> None:
        self.limit = limit
        self.ids: dict[int, str | None] = {}  # the kept calls: index -> id
        self.closed = False  # a new call came at a kept one's index (Ollama: all at 0)

    def __call__(self, batch: Batch) -> Batch:
        if not any(isinstance(d, ToolCallDelta) for d in batch):
            return batch
        return Batch([d for d in batch if self.keep(d)], end=batch.end)

    def keep(self, delta: object) -> bool:
        if not isinstance(delta, ToolCallDelta):
            return True
        if self.closed:
            return False
        ids = self.ids
        if delta.index not in ids:
            if len(ids) >= self.limit:
                return False  # another call; the kept ones may still go on (interleaving)
            ids[delta.index] = delta.id
            return True
        known = ids[delta.index]
        if delta.id is not None and known is not None and delta.id != known:
            self.closed = True  # a new call reusing the index: it and all later ones go
            return False
        ids[delta.index] = known or delta.id
        return True


def first_calls(
    next_batch: Callable[[], Awaitable[Batch]], first: Batch | None, limit: int = 1
) -> tuple[Callable[[], Awaitable[Batch]], Batch | None]:
    """A stream's reader and first batch, filtered to the first `limit` calls."""
    keep = FirstCallOnly(limit)

    async def filtered() -> Batch:
        return keep(await next_batch())

    return filtered, (None if first is None else keep(first))
