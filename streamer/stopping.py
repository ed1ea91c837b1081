"""How a serving process stops on a signal: first the drain window, then the shutdown.

SIGTERM (what an orchestrator, systemd or a `--workers` supervisor sends) opens the drain
window: for `--drain-seconds` the gateway serves as before, listener open, but `/readyz`
answers 503 and answers ask to close their connection, so a load balancer's health checks
move the traffic to other instances before this one stops taking connections. Then the
listener closes and the turns in flight get `--shutdown-grace` seconds (the app's
on_shutdown drain). SIGINT (Ctrl-C) has no window: someone at a terminal wants it to stop.
A second signal in the window ends the window; one during the shutdown cuts it short (as
aiohttp's own handlers do). A SIGTERM that comes while the process is starting
(`early_signals.catch_early`: the imports, the app, the store, the listener) is kept and
acted on once it serves: a starting `--workers` worker that a stopping supervisor signals
stops cleanly instead of dying of the signal. SIGINT while starting interrupts, as ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from streamer.early_signals import EARLY

log = logging.getLogger("streamer.stopping")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Draining:
    """Whether the drain window is open: `/readyz` fails and answers close their connection."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = False


DRAINING = web.AppKey("draining", Draining)


def _graceful_exit() -> None:
    raise web.GracefulExit()


class Stopping:
    """The process's SIGTERM/SIGINT handlers: `first()` returns the first signal."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
        for sig in SIGNALS:
            self._loop.add_signal_handler(sig, self._signals.put_nowait, sig)
        while EARLY:  # received while starting: the first is acted on once serving
            self._signals.put_nowait(EARLY.pop(0))

    async def first(self) -> signal.Signals:
        return await self._signals.get()

    async def window(self, draining: Draining, seconds: float) -> None:
        """The drain window: `seconds` with `draining` open, or until another signal."""
        if seconds <= 0:
            return
        draining.open = True
        log.warning("SIGTERM: /readyz fails for %g s (--drain-seconds) before the listener "
                    "closes", seconds)  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._signals.get(), seconds)

    def cut_short(self) -> None:
        """From now on a signal ends the shutdown (GracefulExit out of the loop)."""
        for sig in SIGNALS:
            self._loop.add_signal_handler(sig, _graceful_exit)

    def remove(self) -> None:
        for sig in SIGNALS:
            self._loop.remove_signal_handler(sig)


async def serve_until_signalled(
    runner: web.AppRunner, site: web.BaseSite, draining: Draining, drain_seconds: float
) -> None:
    """Serve on `site` until SIGTERM/SIGINT (or at once after a SIGTERM while starting),
    then the drain window (SIGTERM only), then the runner's cleanup: the listener closes,
    the app's shutdown drains the turns."""
    stopping = Stopping()
    try:
        await site.start()
        first = await stopping.first()
        if first == signal.SIGTERM:
            await stopping.window(draining, drain_seconds)
    finally:
        stopping.cut_short()
        try:
            await runner.cleanup()
        finally:
            stopping.remove()
