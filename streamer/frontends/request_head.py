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

# every line of a plain head: a token, a colon, visible ASCII or blanks, CRLF (anything
# else, and aiohttp's decoding or refusal would have a say); one C-speed pass
_LINES = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e]*\r\n)*")
# the fields the fast path reads (each at most once), and those it leaves to aiohttp
WANTED = frozenset(
    {"content-length", "content-type", "content-encoding", "connection", "authorization"}
    | {"x-request-id", "traceparent", "tracestate"}  # a client's trace (streamer/tracing.py)
)
REFUSED = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})
# any of them at the start of a line of the lowercased head
_NAMED = re.compile(rb"\r\n(" + b"|".join(sorted(n.encode() for n in WANTED | REFUSED)) + rb"):")
_CONNECTION = frozenset({"close", "keep-alive"})


class Verdict(enum.Enum):
    MORE = 0  # the head is not complete yet
    HAND_OVER = 1  # not the fast path's: aiohttp serves this connection from here


MORE = Verdict.MORE
HAND_OVER = Verdict.HAND_OVER


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x as much
class Head:
    """A fast-path request head: its fields by lowercase name, its body's length, whether
    the client asked to close after the answer, and the head's size (blank line included)."""

    headers: dict[str, str]
    length: int
    close: bool
    size: int


def parse(buf: bytes | bytearray, *, max_line: int, max_body: int, at: int = 0) -> Head | Verdict:
    """The head at the start of `buf`, `MORE`, or `HAND_OVER` (see the module docstring).

    `max_line`: aiohttp's limit on one header line (a longer one is its 400); `max_body`:
    the body limit (a longer body is aiohttp's 413); `at`: how much of `buf` an earlier
    call has searched already (it said `MORE`)."""
    if not buf.startswith(REQUEST_LINE):
        return MORE if REQUEST_LINE.startswith(buf) else HAND_OVER
    end = buf.find(b"\r\n\r\n", max(len(REQUEST_LINE) - 2, at - 3))
    if end < 0:
        return MORE if len(buf) <= MAX_HEAD else HAND_OVER
    if end > MAX_HEAD:
        return HAND_OVER
    headers = _fields(buf[len(REQUEST_LINE) : end + 2], max_line)
    if headers is None:
        return HAND_OVER
    return _head(headers, end + 4, max_body)


def _fields(block: bytes | bytearray, max_line: int) -> dict[str, str] | None:
    """The fields the fast path reads, by lowercase name, from header lines (each ending
    in CRLF); None for anything odd: a line aiohttp would refuse or decode, a line over
    `max_line`, a field it leaves to aiohttp, or one it reads given twice."""
    if _LINES.fullmatch(block) is None:
        return None
    if len(block) > max_line and max(map(len, block.split(b"\r\n"))) > max_line:
        return None
    low = b"\r\n" + block.lower()  # each field's name follows a CRLF
    headers: dict[str, str] = {}
    for match in _NAMED.finditer(low):
        name = match[1].decode()
        if name in REFUSED or name in headers:
            return None
        start = match.end() - 2  # its value, in `block`
        headers[name] = block[start : block.index(b"\r\n", start)].strip(b" \t").decode("ascii")
    return headers


def _head(headers: dict[str, str], size: int, max_body: int) -> Head | Verdict:
    length = headers.get("content-length", "")
    if not length.isdigit() or len(length) > MAX_LENGTH_DIGITS or int(length) >= max_body:
        return HAND_OVER
    coding = headers.get("content-encoding")
    if coding is not None and coding.lower() != "identity":
        return HAND_OVER
    if not json_type(headers.get("content-type")):
        return HAND_OVER
    close = False
    connection = headers.get("connection")
    if connection is not None:
        tokens = {t.strip().lower() for t in connection.split(",")} - {""}
        if not tokens <= _CONNECTION:
            return HAND_OVER
        close = "close" in tokens
    return Head(headers, int(length), close, size)


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
