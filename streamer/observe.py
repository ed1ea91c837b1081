"""One turn's event stream as operators see it: metrics and the optional tap recording.

Every turn runs through `observed` (in `Gateway.run`, whatever its transport), so
counting and recording happen in one place, once per batch of events.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.metrics import Metrics
from streamer.pipeline import Turn, Upstream, stream_events
from streamer.quiet_trim import QuietTrim
from streamer.recorder import ExchangeRecorder, TapDirectory


async def observed(
    turn: Turn,
    upstream: Upstream,
    transport: str,
    metrics: Metrics,
    quiet: QuietTrim,
    tap: TapDirectory | None = None,
) -> AsyncGenerator[list[Event], None]:
    """`stream_events` with metrics and, under `--tap-dir`, a recording of the exchange."""
    started = time.monotonic()
    recorder, own = turn.recorder, turn.recorder is None  # else its opener records the events
    if own and tap is not None:
        recorder = open_recording(tap, turn)
    on_raw = recorder.backend_chunk if recorder is not None else None
    on_request = recorder.backend_request if recorder is not None else None  # a resend too
    sent = metrics.child(metrics.events, transport)
    active = metrics.child(metrics.active_streams, transport)
    active.inc()
    quiet.started()
    first = True
    refused = False
    try:
        async with contextlib.aclosing(
            stream_events(turn, upstream, on_raw=on_raw, on_request=on_request)
        ) as events:
            async for batch in events:
                if first:
                    metrics.first_event.observe(time.monotonic() - started)
                    first = False
                sent.inc(len(batch))
                if recorder is not None and own:
                    recorder.client_events(batch)
                yield batch
                del batch  # not kept while the next batch is awaited
    except RequestError as exc:
        metrics.backend_errors.labels(str(exc.code or exc.status)).inc()
        if recorder is not None and own:
            recorder.error(exc.status, exc.body())
        refused = True
        raise
    finally:
        active.dec()
        quiet.ended()
        status = turn.response["status"]
        if not turn.streamer.done:  # refused before any event, or the client went away
            status = "refused" if first else "abandoned"
            if recorder is not None and own and not refused:  # the recording says why it stops
                recorder.abandoned()
        metrics.child(metrics.duration, status).observe(time.monotonic() - started)
        error = turn.response.get("error")
        if status == "failed" and error:
            metrics.backend_errors.labels(str(error.get("type") or error.get("code"))).inc()
        if recorder is not None and own:
            recorder.close()


def open_recording(tap: TapDirectory, turn: Turn) -> ExchangeRecorder:
    """The turn's recording, with the client's request and the backend's as its first lines."""
    recorder = tap.open(turn.response["id"])
    recorder.client_request(turn.request)
    recorder.backend_request(turn.chat_request)
    return recorder
