"""An encoded Responses stream event (its type and its JSON, serialised exactly once), and
the one list of the events that end a response or a stream."""

from __future__ import annotations

from typing import NamedTuple


class Event(NamedTuple):
    type: str
    data: bytes  # the event object as JSON, including "type" and "sequence_number"
    seq: int = -1  # its sequence_number, kept beside the bytes so nobody re-parses them


TERMINAL_STATUSES: dict[str, tuple[str, ...]] = {
    "response.completed": ("completed",),
    "response.incomplete": ("incomplete",),
    "response.failed": ("failed", "cancelled"),
}
"""Each event that ends a response, and the statuses its response may then have."""

TERMINAL_EVENT_TYPES = frozenset(TERMINAL_STATUSES)
"""The events that end a response. There is no `response.cancelled` stream event (the
name is a webhook's; the SDK's stream event union has none): see `CANCELLED_EVENT`."""

STREAM_END_TYPES = TERMINAL_EVENT_TYPES | {"error"}
"""The events after which a stream carries nothing more: a terminal event, or a bare
`error` (which may never be followed by `response.failed`)."""

CANCELLED_EVENT = "response.failed"
CANCELLED = "cancelled"
"""A cancelled response ends with `CANCELLED_EVENT` whose response has status `CANCELLED`
and `error: null` (as OpenAI's cancelled responses): the terminal event every client
already handles."""
