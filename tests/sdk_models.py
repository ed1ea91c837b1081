"""Validate encoded events and responses against the official SDK's typed models."""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def validate_event(data: bytes | dict[str, Any]) -> Any:
    """Parse one event with the SDK's discriminated union; raises on any mismatch."""
    raw = data if isinstance(data, bytes) else orjson.dumps(data)
    event = _EVENTS.validate_json(raw)
    expected = orjson.loads(raw)["type"]
    assert event.type == expected, (event.type, expected)
    return event


def validate_response(body: dict[str, Any]) -> Response:
    return Response.model_validate(body)
