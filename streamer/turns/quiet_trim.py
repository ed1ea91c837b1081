"""Give the memory a burst of turns freed back to the OS once the gateway goes quiet.

CPython's allocators keep freed memory for reuse: after 64 long streams at once the
process stays at its peak size while idle, and the next burst starts from there. Once no
turn has run for `delay` seconds, `malloc_trim(0)` hands glibc's free pages back (a few
milliseconds, never while a turn is running). Where there is no glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Protocol


def malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`, or None (musl, macOS, ...)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class Timer(Protocol):
    """A pending call, as `asyncio.TimerHandle` is."""

    def cancel(self) -> None: ...


# `call_later(delay, callback)`: runs `callback` once `delay` seconds have passed.
CallLater = Callable[[float, Callable[[], None]], Timer]


def loop_call_later(delay: float, callback: Callable[[], None]) -> Timer:
    """The running event loop's `call_later` (the default clock)."""
    return asyncio.get_running_loop().call_later(delay, callback)


class QuietTrim:
    """Counts running turns; trims once they have all been over for `delay` seconds.

    Time comes from `call_later` alone, so tests drive it with a manual clock.
    """

    def __init__(
        self,
        delay: float,
        trim: Callable[[], object] | None,
        *,
        call_later: CallLater = loop_call_later,
    ) -> None:
        self.delay = delay
        self._trim = trim  # None: count, never trim
        self._call_later = call_later
        self.running = 0
        self.trims = 0
        self._turns = 0  # turns started so far: a turn that came and went resets the wait
        self._timer: Timer | None = None

    def started(self) -> None:
        self.running += 1
        self._turns += 1

    def ended(self) -> None:
        self.running -= 1
        if self.running == 0 and self._trim is not None and self._timer is None:
            self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        turns = self._turns
        self._timer = self._call_later(self.delay, lambda: self._check(turns))

    def _check(self, turns: int) -> None:
        self._timer = None
        if self.running:
            return  # its end arms the next wait
        if self._turns != turns:  # quiet now, but not for long enough
            self._arm()
            return
        assert self._trim is not None
        self._trim()
        self.trims += 1
