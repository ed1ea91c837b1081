"""Just enough HTTP/1.1 for the benchmark's own servers (the load backend and the raw relay).

Hand-rolled on asyncio protocols so that neither server spends its time in a framework:
they must never be what limits a measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import NamedTuple


class Request(NamedTuple):
    method: bytes
    path: bytes
    headers: dict[bytes, bytes]  # lower-case names
    body: bytes
    keep_alive: bool


class BadRequest(ValueError):
    pass


def take_request(buf: bytearray) -> Request | None:
    """Remove one complete request from the front of `buf` and return it; None if incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 65536:
            raise BadRequest("request head too large")
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    try:
        method, path, version = lines[0].split(b" ", 2)
    except ValueError as exc:
        raise BadRequest("bad request line") from exc
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        found = _dechunk(buf, start)
        if found is None:
            return None
        body, consumed = found
    else:
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError as exc:
            raise BadRequest("bad content-length") from exc
        if len(buf) - start < length:
            return None
        body, consumed = bytes(buf[start : start + length]), start + length
    del buf[:consumed]
    conn = headers.get(b"connection", b"").lower()
    keep_alive = conn == b"keep-alive" or (version == b"HTTP/1.1" and conn != b"close")
    return Request(method, path, headers, body, keep_alive)


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        except ValueError as exc:
            raise BadRequest("bad chunk size") from exc
        pos = eol + 2
        if size == 0:
            trailer_end = buf.find(b"\r\n\r\n", pos - 2)
            if trailer_end < 0:
                return None
            return b"".join(parts), trailer_end + 4
        if len(buf) < pos + size + 2:
            return None
        parts.append(bytes(buf[pos : pos + size]))
        pos += size + 2


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying `data`."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def simple_response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 502: b"Bad Gateway"}
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        reason.get(status, b"Error"),
        content_type,
        len(body),
        body,
    )


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def install_uvloop() -> str:
    """Use uvloop when it is there; return the loop's name for the record."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"
