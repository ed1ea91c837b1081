"""An encoded Responses stream event: its type and its JSON, serialised exactly once."""

from __future__ import annotations

from typing import NamedTuple


class Event(NamedTuple):
    type: str
    data: bytes  # the event object as JSON, including "type" and "sequence_number"
    seq: int = -1  # its sequence_number, kept beside the bytes so nobody re-parses them
