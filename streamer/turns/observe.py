"""One turn's event stream as operators see it: metrics and the optional tap recording.

Every turn is observed by an `Observation` (in `Gateway.run`, whatever its transport),
so counting and recording happen in one place, once per batch of events.
"""

from __future__ import annotations

import time

from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.metrics import Metrics
from streamer.turns.quiet_trim import QuietTrim
from streamer.turns.recorder import ExchangeRecorder, TapDirectory
from streamer.turns.turn import Turn


class Observation:
    """What operators see of one turn: metrics and, under `--tap-dir`, its recording.

    `Gateway.run` tells it the turn's batches (`sent`), a refusal (`refused`) and the end
    (`close`, always); a plain object, so that observing costs no generator layer.
    """

    __slots__ = (
        "_active", "_first", "_metrics", "_quiet", "_refused", "_sent", "_started",
        "on_raw", "on_request", "own", "recorder", "turn",
    )  # fmt: skip

    def __init__(
        self,
        turn: Turn,
        transport: str,
        metrics: Metrics,
        quiet: QuietTrim,
        tap: TapDirectory | None = None,
    ) -> None:
        self._started = time.monotonic()
        self.turn = turn
        recorder, own = turn.recorder, turn.recorder is None  # else its opener records the events
        if own and tap is not None:
            recorder = open_recording(tap, turn)
        self.recorder, self.own = recorder, own
        self.on_raw = recorder.backend_chunk if recorder is not None else None
        self.on_request = recorder.backend_request if recorder is not None else None  # a resend too
        self._metrics, self._quiet = metrics, quiet
        self._sent = metrics.child(metrics.events, transport)
        self._active = metrics.child(metrics.active_streams, transport)
        self._active.inc()
        quiet.started()
        self._first = True
        self._refused = False

    def sent(self, batch: list[Event]) -> None:
        if self._first:
            self._metrics.first_event.observe(time.monotonic() - self._started)
            self._first = False
        self._sent.inc(len(batch))
        if self.recorder is not None and self.own:
            self.recorder.client_events(batch)

    def refused(self, exc: RequestError) -> None:
        """The backend refused the turn before any event."""
        self._metrics.backend_errors.labels(str(exc.code or exc.status)).inc()
        if self.recorder is not None and self.own:
            self.recorder.error(exc.status, exc.body())
        self._refused = True

    def close(self) -> None:
        metrics, turn, recorder = self._metrics, self.turn, self.recorder
        self._active.dec()
        self._quiet.ended()
        status = turn.response["status"]
        if not turn.streamer.done:  # refused before any event, or the client went away
            status = "refused" if self._first else "abandoned"
            if recorder is not None and self.own and not self._refused:  # it says why it stops
                recorder.abandoned()
        metrics.child(metrics.duration, status).observe(time.monotonic() - self._started)
        error = turn.response.get("error")
        if status == "failed" and error:
            metrics.backend_errors.labels(str(error.get("type") or error.get("code"))).inc()
        if recorder is not None and self.own:
            recorder.close()


def open_recording(tap: TapDirectory, turn: Turn) -> ExchangeRecorder:
    """The turn's recording, with the client's request and the backend's as its first lines."""
    recorder = tap.open(turn.response["id"])
    recorder.client_request(turn.request, turn.client)
    recorder.backend_request(turn.backend_request)
    return recorder
