"""The Response object skeleton: every field of the spec, request values echoed (pure)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from streamer.core.echo import echo_text, echo_tools

# Request fields the Response echoes as sent, with the spec's default when absent.
_ECHOED: tuple[tuple[str, Any], ...] = (
    ("instructions", None),
    ("max_output_tokens", None),
    ("max_tool_calls", None),
    ("previous_response_id", None),
    ("prompt", None),
    ("prompt_cache_key", None),
    ("prompt_cache_retention", None),
    ("safety_identifier", None),
    ("temperature", 1.0),
    ("top_logprobs", 0),
    ("top_p", 1.0),
    ("truncation", "disabled"),
    ("user", None),
    ("conversation", None),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
)


class _RandomPool:
    """OS randomness drawn 4 kB at a time: one `getrandom` call per ~170 ids, not one per
    id (each call is a system call, ~1 µs on a loaded core; a turn makes four or five ids).

    A forked child starts with an empty pool (`os.register_at_fork`), so it never repeats
    its parent's ids; the gateway makes ids on its event loop thread only.
    """

    __slots__ = ("at", "pool")
    SIZE = 4096

    def __init__(self) -> None:
        self.pool = b""
        self.at = 0

    def take(self, n: int) -> bytes:
        at = self.at
        if at + n > len(self.pool):
            self.pool, at = os.urandom(max(self.SIZE, n)), 0
        self.at = at + n
        return self.pool[at : at + n]

    def reset(self) -> None:
        self.pool, self.at = b"", 0


_RANDOM = _RandomPool()
os.register_at_fork(after_in_child=_RANDOM.reset)


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `prefix_` and 48 random hex digits (unique without coordination)."""
    return f"{prefix}_{_RANDOM.take(24).hex()}"


def new_response(
    request: Mapping[str, Any],
    *,
    response_id: str | None = None,
    created_at: int | None = None,
    model: str | None = None,
    status: str = "in_progress",
) -> dict[str, Any]:
    """The Response as `response.created` shows it: empty output, no usage yet.

    `tools` and `tool_choice` are the client's own (namespace tree intact); the
    flattened view never leaves the gateway.
    """
    reasoning = request.get("reasoning")
    text = request.get("text")
    # tools and text.format: normalised as OpenAI echoes them (streamer/core/echo.py)
    response: dict[str, Any] = {
        "id": response_id or new_id("resp"),
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "background": bool(request.get("background") or False),
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "model": model or request.get("model") or "",
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": echo_tools(request.get("tools")),
        "metadata": request.get("metadata") or {},
        "reasoning": {
            "effort": (reasoning or {}).get("effort"),
            "summary": (reasoning or {}).get("summary"),
        },
        "service_tier": request.get("service_tier") or "default",
        "store": request.get("store", True) is not False,
        "text": echo_text(text),
        "usage": None,
    }
    for field, default in _ECHOED:
        value = request.get(field, default)
        response[field] = default if value is None else value
    return response


def usage_object(
    input_tokens: int = 0,
    output_tokens: int = 0,
    cached_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """The Responses `usage` object, with every detail field present."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": cached_tokens,
            "cache_write_tokens": cache_write_tokens,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
