"""SIGTERMs that come while a process is still starting (importing, opening its store,
binding): kept, not its end, until stopping.py's handlers take them over.

No imports but `signal`, so a `--workers` worker installs it before it imports the app
(aiohttp and the rest take a noticeable time on a loaded machine, and a supervisor that
stops just after it started a worker would otherwise kill it by the signal's default
action: exit by SIGTERM instead of 0).
"""

from __future__ import annotations

import signal

EARLY: list[signal.Signals] = []  # received before `stopping.Stopping` took them over


def _remember(signum: int, frame: object) -> None:
    EARLY.append(signal.Signals(signum))


def catch_early() -> None:
    """From now until `Stopping` takes over, SIGTERM is remembered, not the end."""
    signal.signal(signal.SIGTERM, _remember)
