"""`Batch`: what an upstream stream hands the turn per backend read (pure), and the shape
of an upstream as the turn runner uses it (`Upstream`, `UpstreamStream`: protocols).

An upstream's first batch and its end are plain values: `open()` returns a stream whose
`first` is the batch that came with the backend's head (None when nothing did), and every
batch says whether it is the last (`end`). A stream whose end is found with nothing left
to say (the rest of a body after `[DONE]`, read later) simply stops iterating.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from streamer.core.deltas import Delta


class Batch(list[Delta]):
    """The deltas of one backend read; `end`: no batch follows (the backend's answer is over).

    A list, so a batch is used (and compared) as its deltas are.
    """

    __slots__ = ("end",)

    def __init__(self, deltas: Iterable[Delta] = (), end: bool = False) -> None:
        super().__init__(deltas)
        self.end = end

    def __repr__(self) -> str:
        return f"Batch({list.__repr__(self)}, end={self.end})"


class UpstreamStream(Protocol):
    """An opened backend answer: `first`, the batch that came with its head (None when
    nothing did), then the batches iterated, the last one `end`."""

    first: Batch | None

    def __aiter__(self) -> AsyncIterator[Batch]: ...
    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """What a turn needs of a backend client (see streamer/upstream/chat/client.py)."""

    async def open(
        self,
        backend_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> UpstreamStream: ...
