"""Structured logs: one JSON object per line, each carrying the request id it belongs to."""

from __future__ import annotations

import contextvars
import logging
import re
import time
from typing import Any

import orjson

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

worker: int | None = None  # this process's index under `--workers N`

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
        if worker is not None:
            line["worker"] = worker
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update(extra)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class ClientProtocolErrors(logging.Filter):
    """aiohttp logs a client's malformed HTTP (an oversized header, TLS sent to the HTTP
    port) as an error with a traceback. It is the client's fault and it got its 400: keep
    one info line, so that any client cannot fill the logs of a quiet gateway."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "malformed request from a client: %s", (exc.message,)
        record.exc_info = record.exc_text = None
        return logging.getLogger().isEnabledFor(logging.INFO)


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # we log our own access lines
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ClientProtocolErrors) for f in server.filters):
        server.addFilter(ClientProtocolErrors())


_access = logging.getLogger("streamer.access")


def access(method: str, path: str, status: int, started: float) -> None:
    if not _access.isEnabledFor(logging.INFO):  # quiet by default: build nothing per request
        return
    _access.info(
        "%s %s %d", method, path, status,
        extra={"fields": {"method": method, "path": path, "status": status,
                          "ms": round((time.monotonic() - started) * 1000, 2)}},
    )  # fmt: skip
