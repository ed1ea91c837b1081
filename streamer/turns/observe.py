"""One turn's event stream as operators see it: metrics, its span, its part of the access
line and the optional tap recording.

Every turn is observed by an `Observation` (in `Gateway.run`, whatever its transport),
so counting, tracing and recording happen in one place, once per batch of events (the
first token's time: a test per batch until it has come) and once at the turn's end.
"""

from __future__ import annotations

import time
from typing import Any

from streamer import logs, tracing
from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.metrics import Metrics
from streamer.turns.genai_spans import TurnTrace
from streamer.turns.quiet_trim import QuietTrim
from streamer.turns.recorder import ExchangeRecorder, TapDirectory
from streamer.turns.turn import Turn


class Observation:
    """What operators see of one turn: metrics and, under `--tap-dir`, its recording.

    `Gateway.run` tells it the turn's batches (`sent`), a refusal (`refused`) and the end
    (`close`, always); a plain object, so that observing costs no generator layer.
    """

    __slots__ = (
        "_active", "_error", "_first", "_first_token", "_metrics", "_quiet", "_sent",
        "_started", "_trace", "_transport", "on_raw", "on_request", "own", "recorder", "turn",
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
        self._first_token: float | None = None  # seconds from the start to the first output
        self._error: str | None = None  # the refusal's code (the backend's, or the router's)
        self._transport = transport
        self._trace = TurnTrace(turn, transport) if tracing.enabled() else None

    def sent(self, batch: list[Event]) -> None:
        if self._first_token is None:
            now = time.monotonic()
            if self._first:
                self._metrics.first_event.observe(now - self._started)
                self._first = False
            if batch and batch[-1].type not in _BEFORE_OUTPUT:  # the backend's first output
                self._first_token = now - self._started
        self._sent.inc(len(batch))
        if self.recorder is not None and self.own:
            self.recorder.client_events(batch)

    def refused(self, exc: RequestError) -> None:
        """The backend refused the turn before any event."""
        self._metrics.backend_errors.labels(str(exc.code or exc.status)).inc()
        self._error = str(exc.code or exc.status)
        if self.recorder is not None and self.own:
            self.recorder.error(exc.status, exc.body())

    def close(self) -> None:
        metrics, turn, recorder = self._metrics, self.turn, self.recorder
        self._active.dec()
        self._quiet.ended()
        status = turn.response["status"]
        if not turn.streamer.done:  # refused before any event, or the client went away
            status = "refused" if self._first else "abandoned"
            if recorder is not None and self.own and self._error is None:  # it says why it stops
                recorder.abandoned()
        took = time.monotonic() - self._started
        metrics.child(metrics.duration, status).observe(took)
        error = turn.response.get("error")
        if status == "failed" and error:
            metrics.backend_errors.labels(str(error.get("type") or error.get("code"))).inc()
            self._error = str(error.get("code") or error.get("type"))
        self._count(status, took)
        if self._trace is not None:
            self._trace.close(turn, status, self._error)
        if logs.access_on():
            fields = access_fields(turn, status, took, self._first_token, self._error)
            logs.turn_ended(self._transport, fields)
        if recorder is not None and self.own:
            recorder.close()

    def _count(self, status: str, took: float) -> None:
        """The turn's metrics by model (bounded) and replica: its end, tokens, times."""
        metrics, turn = self._metrics, self.turn
        model = metrics.model_label(turn.response.get("model"))
        labels = (self._transport, model, turn.replica or "none", status)
        metrics.child(metrics.responses, *labels).inc()
        if status == "refused":
            return  # no backend answer to time
        metrics.child(metrics.backend_duration, model).observe(took)
        if self._first_token is not None:
            metrics.child(metrics.backend_first_token, model).observe(self._first_token)
        usage = turn.response.get("usage")
        if not isinstance(usage, dict):
            return
        client = turn.client[:12] if turn.client and metrics.per_client else None
        for direction, key in _DIRECTIONS:
            count = usage.get(key)
            if isinstance(count, int) and count > 0:
                metrics.child(metrics.tokens, model, direction).inc(count)
                if client is not None:
                    metrics.child(metrics.client_tokens, client, direction).inc(count)


_DIRECTIONS = (("input", "input_tokens"), ("output", "output_tokens"))
# the events of a turn before the backend's first output
_BEFORE_OUTPUT = frozenset({"response.created", "response.in_progress", "response.queued"})


def access_fields(
    turn: Turn, status: str, took: float, first: float | None, error: str | None
) -> dict[str, Any]:
    """A turn's part of the access line: which response, where it ran, how it ended."""
    response = turn.response
    fields: dict[str, Any] = {
        "response_id": response.get("id"),
        "model": response.get("model"),
        "replica": turn.replica or None,
        "response_status": status,
        "turn_ms": round(took * 1000, 2),
    }
    if first is not None:
        fields["first_token_ms"] = round(first * 1000, 2)
    usage = response.get("usage")
    if isinstance(usage, dict):
        fields["input_tokens"] = usage.get("input_tokens")
        fields["output_tokens"] = usage.get("output_tokens")
    if error is not None:
        fields["error_code"] = error
    return fields


def open_recording(tap: TapDirectory, turn: Turn) -> ExchangeRecorder:
    """The turn's recording, with the client's request and the backend's as its first lines."""
    recorder = tap.open(turn.response["id"])
    recorder.client_request(turn.request, turn.client)
    recorder.backend_request(turn.backend_request)
    return recorder
