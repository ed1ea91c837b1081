"""Structured logs: one JSON object per line, each carrying the request id it belongs to."""

from __future__ import annotations

import contextvars
import logging
import re
import time
from typing import Any

import orjson

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_CLIENT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def choose_request_id(offered: str | None, fresh: str) -> str:
    """The client's `X-Request-Id` when it is sane, else a fresh one."""
    return offered if offered and _CLIENT_ID.fullmatch(offered) else fresh


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id.get()
        if rid:
            line["request_id"] = rid
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update(extra)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # we log our own access lines


def access(method: str, path: str, status: int, started: float) -> None:
    logging.getLogger("streamer.access").info(
        "%s %s %d", method, path, status,
        extra={"fields": {"method": method, "path": path, "status": status,
                          "ms": round((time.monotonic() - started) * 1000, 2)}},
    )  # fmt: skip
