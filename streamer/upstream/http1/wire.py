"""HTTP/1.1 responses as bytes: the status line and headers, the body's framing, and
`Transfer-Encoding: chunked` (sans I/O; `http1` is the client around them).

`ChunkedDecoder` strips the chunk framing of a body fed in pieces split anywhere. Its common
case costs no Python per chunk: one `split` at CRLFs, and sizes checked against lengths with
`map`; chunk extensions, trailers, or CRLFs inside the data fall back to a loop of one
`find` and one `int` per chunk. Both paths take a chunk size by one rule (`_chunk_size`):
1 to 15 hex digits, nothing else (`int(b"0x1a", 16)` and `int(b"1_a", 16)` would succeed),
then, on the loop path, optional extensions after `;`.
"""

from __future__ import annotations

import itertools

from multidict import CIMultiDict

from streamer.core import speed
from streamer.core.scrub import excerpt

MAX_HEAD = 64 << 10  # status line and headers
MAX_HEADERS = 256
MAX_LINE = 4096  # a chunk-size line, with its extensions
MAX_TRAILERS = 16 << 10

_SIZE, _DATA, _CRLF, _TRAILER, _END = range(5)  # states of the chunked decoder
_HEX = b"0123456789abcdefABCDEF"
MAX_SIZE_DIGITS = 15  # a chunk of 2**60 bytes is already absurd; more digits are garbage


class HTTPClientError(Exception):
    """Base of the errors raised here; none of them carries request headers."""


class ConnectError(HTTPClientError):
    """No connection: refused, unresolvable, TLS failure or connect timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServerDisconnected(HTTPClientError, ConnectionError):
    """The server closed the connection before the response ended."""


class ProtocolError(HTTPClientError):
    """The server's bytes are not a valid HTTP/1.1 response.

    `quoted`: the server's own bytes it is about, placed in `message` at `{}` (else after
    it, as a repr). `str()` never shows them; `shown(secrets)` does, scrubbed of whole
    secrets before they are cut to `limit` (streamer/core/scrub.py).
    """

    def __init__(self, message: str, quoted: bytes | str = b"", limit: int = 80) -> None:
        self.template = message if "{" in message or not quoted else message + " {!r}"
        super().__init__(self.template.format("…") if quoted else message)
        self.quoted = quoted
        self.limit = limit

    def shown(self, secrets: tuple[str, ...] = ()) -> str:
        """The message, quoting the server's bytes (at most `limit` of them, secrets out)."""
        if not self.quoted:
            return str(self)
        quoted = self.quoted
        if isinstance(quoted, bytes):
            return self.template.format(excerpt(quoted, self.limit, secrets))
        return self.template.format(excerpt(quoted, self.limit, secrets))


class ReadTimeout(HTTPClientError, TimeoutError):
    """Nothing arrived from the server for the idle timeout."""


def parse_head(head: bytes) -> tuple[int, str, CIMultiDict[str], bool]:
    """Status line and headers (without the blank line) -> status, reason, headers, HTTP/1.1."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    version = parts[0]
    if len(parts) < 2 or version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise ProtocolError("bad status line", lines[0])
    code = parts[1]
    if len(code) != 3 or not code.isdigit():
        raise ProtocolError("bad status code", code, 20)
    if not b"100" <= code <= b"599":  # "000", "099", "600", "999"
        raise ProtocolError(f"status code {code.decode()} out of range")
    if len(lines) > MAX_HEADERS + 1:
        raise ProtocolError("too many headers")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name or b"\t" in name:
            raise ProtocolError("bad header line", line)
        if b"\n" in line or b"\r" in line or b"\0" in line:
            raise ProtocolError("bad character in header line", line)
        headers.add(name.decode("latin-1"), value.strip(b" \t").decode("latin-1"))
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return int(code), reason, headers, version == b"HTTP/1.1"


def body_length(status: int, headers: CIMultiDict[str]) -> int | None:
    """How the body is delimited: its length, -1 chunked, None until the connection closes."""
    if status < 200 or status in (204, 304):
        return 0
    coding = headers.getall("Transfer-Encoding", None)
    if coding:  # the last transfer-coding, empty list elements ignored
        codings = [c for c in (c.strip() for c in ",".join(coding).split(",")) if c]
        return -1 if codings and codings[-1].lower() == "chunked" else None
    lengths = headers.getall("Content-Length", None)
    if not lengths:
        return None
    values = {v.strip() for value in lengths for v in value.split(",")}
    if len(values) != 1 or not (value := values.pop()).isdigit() or not value.isascii():
        raise ProtocolError("bad content-length", ", ".join(lengths))
    return int(value)


class ChunkedDecoder:
    """`Transfer-Encoding: chunked` -> the payload; fed the bytes split anywhere.

    `feed` returns the payload bytes completed by this piece; `done` is set after the last
    chunk and its trailers (ignored), and `tail` holds whatever followed them.
    `bulk=False` keeps to the per-chunk loop (the reference the bulk path is tested against;
    the default follows the `chunked` speed switch, core/speed.py).
    """

    __slots__ = ("_fast", "_left", "_line", "_state", "_trailers", "done", "tail")

    def __init__(self, *, bulk: bool | None = None) -> None:
        self._fast = speed.fast("chunked") if bulk is None else bulk  # bulk until it fails once
        self._state = _SIZE
        self._left = 0  # data bytes of the current chunk still to come, or CRLF bytes (_CRLF)
        self._line = b""  # an incomplete size or trailer line
        self._trailers = 0
        self.done = False
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        if self._line:
            data, self._line = self._line + data, b""
        out: list[bytes] = []
        if self._state in (_DATA, _CRLF):  # the end of a chunk cut by the previous read
            pos = self._run(data, out, stop_at_size=True)
            data = data[pos:] if pos < len(data) else b""
        if data and self._state == _SIZE and self._fast:
            data = self._bulk(data, out)
        if data:
            self._run(data, out)
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _run(self, data: bytes, out: list[bytes], stop_at_size: bool = False) -> int:
        """The state machine, chunk by chunk; returns where it stopped."""
        pos, n, state = 0, len(data), self._state
        find = data.find
        while pos < n:
            if state == _SIZE:  # a find, an int and a slice per chunk
                eol = find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > MAX_LINE:
                        raise ProtocolError("chunk-size line too long")
                    self._line = data[pos:]
                    break
                line = data[pos:eol]
                if 0 < len(line) <= MAX_SIZE_DIGITS and not line.translate(None, _HEX):
                    size = int(line, 16)  # the common case: digits only
                else:
                    size = _chunk_size(line)
                start = eol + 2
                if size == 0:
                    state, pos = _TRAILER, eol
                    continue
                end = start + size
                if end + 2 <= n:
                    if not data.startswith(b"\r\n", end):
                        raise ProtocolError("chunk data not followed by CRLF")
                    out.append(data[start:end])
                    pos = end + 2
                    continue
                out.append(data[start:end])
                if end <= n:
                    state, self._left, pos = _CRLF, 2, end
                else:
                    state, self._left, pos = _DATA, end - n, n
            elif state == _DATA:
                take = min(self._left, n - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    state, self._left = _CRLF, 2
            elif state == _CRLF:  # the rare states (once per read or per body): methods
                pos, state = self._crlf(data, pos)
                if state == _SIZE and stop_at_size:
                    break
            elif state == _TRAILER:
                eol = self._trailer(data, pos)
                if eol < 0:  # an incomplete line, or the end of the body
                    state = _END if self.done else _TRAILER
                    break
                pos = eol
            else:  # _END: nothing more belongs to this body
                self.tail += data[pos:]
                pos = n
                break
        self._state = state
        return pos

    def _crlf(self, data: bytes, pos: int) -> tuple[int, int]:
        """The CRLF after a chunk's data, perhaps split across reads: (pos, state)."""
        want = b"\r\n"[2 - self._left :]
        got = data[pos : pos + len(want)]
        if not want.startswith(got):
            raise ProtocolError("chunk data not followed by CRLF")
        self._left -= len(got)
        return pos + len(got), _CRLF if self._left else _SIZE

    def _trailer(self, data: bytes, pos: int) -> int:
        """One trailer line from `pos` (a CRLF that ends the previous line): where the next
        starts, or -1 to stop (the line is incomplete, or the body ended: `done`)."""
        eol = data.find(b"\r\n", pos + 2)
        if eol < 0:
            self._line = data[pos:]
            if len(self._line) > MAX_TRAILERS:
                raise ProtocolError("trailers too large")
            return -1
        self._trailers += eol - pos
        if self._trailers > MAX_TRAILERS:
            raise ProtocolError("trailers too large")
        if eol == pos + 2:  # an empty line: the end of the body
            self.done, self.tail = True, data[eol + 2 :]
            return -1
        return eol

    def _bulk(self, data: bytes, out: list[bytes]) -> bytes:
        """The common case at a chunk boundary, with no per-chunk Python: split at every
        CRLF and check that sizes and data alternate. Returns what is left for the loop
        (b"" when all was taken); data with CRLFs inside turns this path off."""
        parts = data.split(b"\r\n")
        k = (len(parts) - 1) >> 1  # complete size/data pairs
        if not k:
            return data
        sizes = parts[0 : 2 * k : 2]
        pieces = parts[1 : 2 * k : 2]
        lens = list(map(len, pieces))
        try:  # the usual sizes are the lengths in lowercase hex: a table lookup, not `int`
            canonical = list(map(_HEX_OF.__getitem__, lens))
        except IndexError:  # a chunk of 4 KiB or more
            canonical = None
        if canonical == sizes:
            nums: list[int] | None = lens
        # `int` alone would take "0x1a", "+1a", " 1a", "1_a": hex digits only, as in the loop
        elif (joined := b"".join(sizes)).translate(None, _HEX) or (
            # Over 15 digits is refused too. A size that matches its piece's length (< 64 KiB
            # when the data is) has 4 significant digits at most, so one of 16 digits or more
            # has 12 leading zeros; only then (or for larger data) are sizes measured one by one.
            (_ZEROS in joined or len(data) > 1 << 16) and max(map(len, sizes)) > MAX_SIZE_DIGITS
        ):
            nums = None  # an extension, or garbage: the loop decides
        else:
            try:
                nums = list(map(int, sizes, _SIXTEEN))
            except ValueError:  # an empty size line
                nums = None
        if nums is None or nums != lens:
            self._fast = False
            return data
        if 0 in nums:  # the last chunk, no trailers: the body ends here
            j = nums.index(0)
            out += pieces[:j]
            self._state, self.done = _END, True
            self.tail = b"\r\n".join(parts[2 * j + 2 :])
            return b""
        out += pieces
        rest = parts[2 * k :]
        if len(rest) == 1:  # a size line cut short (or nothing)
            return rest[0]
        return rest[0] + b"\r\n" + rest[1]  # a chunk cut short: the loop streams it


_SIXTEEN = itertools.repeat(16)
_HEX_OF = [b"%x" % n for n in range(4096)]  # chunk sizes as backends write them, 1-3 digits
_ZEROS = b"0" * 12


def _chunk_size(line: bytes) -> int:
    """A chunk-size line: 1-15 hex digits, then nothing or (after optional blanks) `;` and
    extensions, which are ignored."""
    size, semi, _ = line.partition(b";")
    if semi:
        size = size.rstrip(b" \t")  # "bad whitespace" before an extension is allowed
    if not size or len(size) > MAX_SIZE_DIGITS or size.translate(None, _HEX):
        raise ProtocolError("bad chunk size", line, 40)
    return int(size, 16)
