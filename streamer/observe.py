"""One turn's event stream as operators see it: metrics and the optional tap recording.

Every frontend (SSE, JSON, WebSocket, background) runs its turn through `observed`,
so counting and recording happen in one place, once per batch of events.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.pipeline import Turn, stream_events

if TYPE_CHECKING:
    from streamer.gateway import Gateway


async def observed(gateway: Gateway, turn: Turn, transport: str) -> AsyncIterator[list[Event]]:
    """`stream_events` with metrics and, under `--tap-dir`, a recording of the exchange."""
    metrics = gateway.metrics
    started = time.monotonic()
    recorder = gateway.tap.open(turn.response["id"]) if gateway.tap is not None else None
    on_raw = None
    if recorder is not None:
        recorder.client_request(turn.request)
        recorder.backend_request(turn.chat_request)
        on_raw = recorder.backend_chunk
    sent = metrics.child(metrics.events, transport)
    active = metrics.child(metrics.active_streams, transport)
    active.inc()
    gateway.quiet.started()
    first = True
    try:
        async with contextlib.aclosing(
            stream_events(turn, gateway.upstream, on_raw=on_raw)
        ) as events:
            async for batch in events:
                if first:
                    metrics.first_event.observe(time.monotonic() - started)
                    first = False
                sent.inc(len(batch))
                if recorder is not None:
                    recorder.client_events(batch)
                yield batch
    except RequestError as exc:
        metrics.backend_errors.labels(str(exc.code or exc.status)).inc()
        if recorder is not None:
            recorder.error(exc.status, exc.body())
        raise
    finally:
        active.dec()
        gateway.quiet.ended()
        status = turn.response["status"]
        if not turn.streamer.done:  # refused before any event, or the client went away
            status = "refused" if first else "abandoned"
        metrics.child(metrics.duration, status).observe(time.monotonic() - started)
        error = turn.response.get("error")
        if status == "failed" and error:
            metrics.backend_errors.labels(str(error.get("type") or error.get("code"))).inc()
        if recorder is not None:
            recorder.close()
