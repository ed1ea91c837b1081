"""The program of one `--workers` worker: read its `Seat` on stdin, then serve.

Apart from `streamer.worker` so that the modules the app imports never import the app.
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    from streamer.early_signals import catch_early

    # before the app's imports (slow on a loaded machine): a SIGTERM while starting is kept,
    # not the end; a SIGHUP the supervisor passes on is harmless unless the app handles it
    catch_early()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from streamer.app import serve
    from streamer.worker import Seat

    line = sys.stdin.buffer.readline()
    if not line:
        return 1  # the supervisor went away before it told us anything
    seat = Seat.decode(line)
    serve(seat.settings, worker=seat)
    return 0
