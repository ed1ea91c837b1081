"""The request heads the fast path serves, and its answers' framing (sans I/O).

`parse` reads a connection's buffered bytes and says one of three things: a plain
`POST /v1/responses` whose head is complete (`Head`), `MORE` bytes needed, or `HAND_OVER`:
anything else, or anything odd, goes to aiohttp, which answers it as it always has (its
own 400s, 413s, 415s, chunked bodies, codings, upgrades). The rules are deliberately
narrow: a head the fast path takes means the same thing to both servers, so taking it
here changes nothing a client can see (tests/test_fast_http.py checks that side by side).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

REQUEST_LINE = b"POST /v1/responses HTTP/1.1\r\n"
MAX_HEAD = 64 << 10  # beyond it aiohttp decides (its limits are per line)
MAX_LENGTH_DIGITS = 18

# a header line: a token, a colon, the value between optional blanks
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")
# anything but visible ASCII, blanks and CRLF pairs: aiohttp's decoding would have a say
_ODD = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\xff]|\r(?!\n)|(?<!\r)\n")
# the headers whose meaning the fast path changes with, or does not implement
_REFUSED = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})
_CONNECTION = frozenset({"close", "keep-alive"})


class Verdict(enum.Enum):
    MORE = 0  # the head is not complete yet
    HAND_OVER = 1  # not the fast path's: aiohttp serves this connection from here


MORE = Verdict.MORE
HAND_OVER = Verdict.HAND_OVER


@dataclass(frozen=True, slots=True)
class Head:
    """A fast-path request head: its fields by lowercase name, its body's length, whether
    the client asked to close after the answer, and the head's size (blank line included)."""

    headers: dict[str, str]
    length: int
    close: bool
    size: int


def parse(buf: bytes, *, max_line: int, max_body: int) -> Head | Verdict:
    """The head at the start of `buf`, `MORE`, or `HAND_OVER` (see the module docstring).

    `max_line`: aiohttp's limit on one header line (a longer one is its 400); `max_body`:
    the body limit (a longer body is aiohttp's 413)."""
    if not buf.startswith(REQUEST_LINE):
        return MORE if REQUEST_LINE.startswith(buf) else HAND_OVER
    end = buf.find(b"\r\n\r\n", len(REQUEST_LINE) - 2)
    if end < 0:
        return MORE if len(buf) <= MAX_HEAD else HAND_OVER
    if end > MAX_HEAD:
        return HAND_OVER
    start = len(REQUEST_LINE)
    headers = _fields(buf[start:end], max_line) if end > start else {}
    if headers is None:
        return HAND_OVER
    return _head(headers, end + 4, max_body)


def _fields(block: bytes, max_line: int) -> dict[str, str] | None:
    """Header lines -> fields by lowercase name; None for anything odd (a repeated name,
    an obsolete line fold, a byte aiohttp would decode or refuse)."""
    if _ODD.search(block):
        return None
    headers: dict[str, str] = {}
    for line in block.split(b"\r\n"):
        match = _FIELD.fullmatch(line)
        if match is None or len(line) > max_line:
            return None
        name = match[1].decode("ascii").lower()
        if name in headers:
            return None
        headers[name] = match[2].decode("ascii")
    return headers


def _head(headers: dict[str, str], size: int, max_body: int) -> Head | Verdict:
    if not _REFUSED.isdisjoint(headers):
        return HAND_OVER
    length = headers.get("content-length", "")
    if not length.isdigit() or len(length) > MAX_LENGTH_DIGITS or int(length) >= max_body:
        return HAND_OVER
    coding = headers.get("content-encoding")
    if coding is not None and coding.lower() != "identity":
        return HAND_OVER
    if not json_type(headers.get("content-type")):
        return HAND_OVER
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")} - {""}
    if not tokens <= _CONNECTION:
        return HAND_OVER
    return Head(headers, int(length), "close" in tokens, size)


def json_type(value: str | None) -> bool:
    """A Content-Type the JSON reader takes, spelt plainly (else aiohttp's parse decides)."""
    if value is None:
        return True  # aiohttp reads it as application/octet-stream: taken
    mime, _, params = value.partition(";")
    mime = mime.strip().lower()
    if '"' in params or "," in value:
        return False
    return mime in ("application/json", "application/octet-stream") or (
        mime.endswith("+json") and mime.count("/") == 1
    )


def chunk(data: bytes, last: bool = False) -> bytes:
    """`data` as one chunk of a chunked body (none when empty), then its end if `last`."""
    framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
    return framed + b"0\r\n\r\n" if last else framed


REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def response_head(status: int, fields: list[tuple[str, str]]) -> bytes:
    """The status line and header fields of an answer, blank line included."""
    reason = REASONS.get(status)
    if reason is None:
        from http import HTTPStatus

        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines.extend(f"{name}: {value}" for name, value in fields)
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")
