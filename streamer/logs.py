"""Structured logs: one JSON object per line, each carrying the request id it belongs to."""

from __future__ import annotations

import contextvars
import logging
import re
import time
from typing import Any

import orjson

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
# the request's turn, for its access line (set by whoever observes the request)
request_fields: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "request_fields", default=None
)

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


def configure(level: str, access_log: bool = True) -> None:
    # A record's caller, thread and process are work per line (a frame walk, two lookups)
    # that JsonFormatter never writes: an access line per request makes it hot (the
    # logging HOWTO's "Optimization" switches).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # we log our own access lines
    # --access-log: at info whatever --log-level (the root's level does not stop a record a
    # logger let through: it reaches the root's handler)
    _access.setLevel(logging.INFO if access_log else logging.CRITICAL + 1)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ClientProtocolErrors) for f in server.filters):
        server.addFilter(ClientProtocolErrors())


_access = logging.getLogger("streamer.access")


def access_on() -> bool:
    return _access.isEnabledFor(logging.INFO)


def access(
    method: str, path: str, status: int, started: float, turn: dict[str, Any] | None = None
) -> None:
    """The request's access line (`--access-log`); `turn`: its turn's fields
    (`observe.access_fields`: response id, model, replica, response status, tokens)."""
    if not _access.isEnabledFor(logging.INFO):  # --access-log off: build nothing per request
        return
    fields = {"method": method, "path": path, "status": status,
              "ms": round((time.monotonic() - started) * 1000, 2)}  # fmt: skip
    if turn:
        fields.update(turn)
    _access.info("%s %s %d", method, path, status, extra={"fields": fields})


# the transports whose turn is the request's own: its fields join the request's line
_REQUEST_TURNS = frozenset({"sse", "json"})


def turn_ended(transport: str, fields: dict[str, Any]) -> None:
    """A turn's end: its fields join its HTTP request's access line; a WebSocket's or
    background turn (which outlives or shares its request) has a line of its own."""
    if transport in _REQUEST_TURNS:
        held = request_fields.get()
        if held is not None:
            held.update(fields)
            return
    _access.info(
        "turn %s %s", transport, fields.get("response_status"),
        extra={"fields": {"transport": transport, **fields}},
    )  # fmt: skip
