"""SSE keepalive comments: a stream quiet for `--sse-keepalive` seconds gets `: keepalive`.

A proxy with an idle timeout shorter than a quiet stretch of a stream (a model reading a
long prompt before its first token, a long tool call being written, a background follower
waiting on a slow turn) cuts the stream with no terminal event. A comment line (`:`) is
ignored by every SSE parser (the HTML spec's event stream format) and resets the proxy's
idle timer.

One timer per stream, armed for the last write plus the interval; each write of the
stream marks its time (`wrote`: one attribute store). The comment goes out in a task of its
own through the stream's own `write`, never after the stream ended (`stop`). Writes are
whole on the transport, so a comment never lands inside an event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

COMMENT = b": keepalive\n\n"


class Keepalive:
    """Comments on one stream while it is quiet; `stop` once its last write is made."""

    __slots__ = ("_handle", "_loop", "_task", "_write", "ended", "interval", "last", "sent")

    def __init__(self, interval: float, write: Callable[[bytes], Awaitable[object]]) -> None:
        self.interval = interval
        self._write = write
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self.ended = False
        self.sent = 0  # comments written
        self._task: asyncio.Task[None] | None = None
        self._handle = self._loop.call_later(interval, self._due) if interval > 0 else None

    def wrote(self) -> None:
        """The stream wrote (its timer is moved on when it fires)."""
        self.last = self._loop.time()

    def _due(self) -> None:
        now = self._loop.time()
        if self.ended:
            return
        if now - self.last >= self.interval and self._task is None:
            self.last = now
            self._task = self._loop.create_task(self._send())
        self._handle = self._loop.call_later(self.last + self.interval - now, self._due)

    async def _send(self) -> None:
        try:
            if not self.ended:  # checked in the step that writes: no write after the end
                await self._write(COMMENT)
                self.sent += 1
        except (ConnectionError, RuntimeError):  # gone or closed: the stream's own write says so
            pass
        finally:
            self._task = None

    def stop(self) -> None:
        """No comment from now on (call it before the stream's last write)."""
        self.ended = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    async def close(self) -> None:
        """`stop`, and wait for a comment under way (its write is whole)."""
        self.stop()
        task = self._task
        if task is not None:
            with contextlib.suppress(BaseException):
                await task
