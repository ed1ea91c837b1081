"""A request body as it arrives, over plain bytes (sans I/O): what its head must say of it,
and its bytes held to two limits while they come.

- `check_media` / `check_coding`: a JSON media type (415 beyond) and one known
  Content-Encoding (415 beyond: zstd, which Codex sends, gzip, deflate, br, or none);
- `BodyReader`: the bytes on the wire count against `--max-body-bytes`, the decoded ones
  against `--max-decoded-body-bytes`, both as they come: a small compressed body that
  decodes to much more is refused once the limit is crossed, never decoded whole first
  (the decoder gives at most 256 KiB per step, `upstream/http1/content_coding.py`).

Every refusal here is made before the body is whole; the connection closes after it
(`Connection: close`): the rest of the body is not worth reading.
"""

from __future__ import annotations

from streamer.core.errors import RequestError
from streamer.upstream.http1.content_coding import BodyDecoder, ContentCodingError

# What the gateway decodes: one coding exactly (brotli and zstd are dependencies).
BODY_CODINGS = ("", "identity", "gzip", "deflate", "br", "zstd")
PIECE = 64 << 10  # compressed bytes fed to the decoder at once (its input is recopied per step)


def closing(error: RequestError) -> RequestError:
    """`error`, said before the body was read (or while it was): the connection closes."""
    error.headers = {**error.headers, "Connection": "close"}
    return error


def check_media(mime: str) -> None:
    """A JSON body (or one that does not say), else the 415. `mime`: lowercase, no
    parameters; a request without Content-Type is application/octet-stream."""
    if mime not in ("application/json", "application/octet-stream", "") and not mime.endswith(
        "+json"
    ):
        raise closing(
            RequestError(
                f"Unsupported content type {mime!r}: send application/json.",
                status=415,
                code="unsupported_media_type",
            )
        )


def check_coding(header: str | None) -> str:
    """One known Content-Encoding (lowercase, "" for none), or a 415 naming the ones taken."""
    coding = (header or "").strip().lower()
    if coding not in BODY_CODINGS:
        shown = (header or "").strip()
        raise closing(
            RequestError(
                f"Unsupported Content-Encoding {shown!r}: send one of zstd, gzip, "
                "deflate or br (one coding), or none.",
                status=415,
                code="unsupported_content_encoding",
            )
        )
    return "" if coding == "identity" else coding


def too_large(limit: int, decoded: bool = False) -> RequestError:
    said = "once decoded (its Content-Encoding undone)" if decoded else ""
    return closing(
        RequestError(
            f"The request body is too large{' ' + said if said else ''}: the limit is "
            f"{limit} bytes.",
            status=413,
            code="request_too_large",
        )
    )


def unreadable(reason: str) -> RequestError:
    return closing(
        RequestError(
            f"We could not read the body of your request: {reason}.",
            code="invalid_body",
        )
    )


def late(seconds: float) -> RequestError:
    """The body did not arrive in time (slowloris): answered, then the connection closed."""
    return closing(
        RequestError(
            f"The request body did not arrive within {seconds:g} seconds.",
            status=408,
            code="request_timeout",
        )
    )


class BodyReader:
    """One body: `feed` it as it comes (raises the 413 or the 400 of a corrupt coding as
    soon as they are certain), then `finish` for the decoded bytes."""

    __slots__ = ("_decoder", "_parts", "_size", "_wire", "max_decoded", "max_wire")

    def __init__(self, coding: str, max_wire: int, max_decoded: int, length: int | None) -> None:
        """`length`: the head's Content-Length (None: not given); over the wire limit, the
        413 before any byte."""
        if length is not None and length > max_wire:
            raise too_large(max_wire)
        self._decoder = BodyDecoder([coding]) if coding else None
        self._parts: list[bytes] = []
        self._size = 0  # decoded bytes so far
        self._wire = 0
        self.max_wire = max_wire
        self.max_decoded = max_decoded

    def feed(self, data: bytes) -> None:
        self._wire += len(data)
        if self._wire > self.max_wire:
            raise too_large(self.max_wire)
        decoder = self._decoder
        if decoder is None:  # identity: the decoded bytes are these
            if self._wire > self.max_decoded:
                raise too_large(self.max_decoded)
            self._parts.append(data)
            return
        try:
            for at in range(0, len(data), PIECE):
                self._add(decoder.decode(data[at : at + PIECE]))
                while decoder.pending:
                    self._add(decoder.decode(b""))
        except ContentCodingError as exc:
            raise unreadable(str(exc)) from None

    def _add(self, data: bytes) -> None:
        if data:
            self._size += len(data)
            if self._size > self.max_decoded:
                raise too_large(self.max_decoded, decoded=self._decoder is not None)
            self._parts.append(data)

    def finish(self) -> bytes:
        """The whole decoded body (a 400 if its coding was cut short)."""
        if self._decoder is not None:
            try:
                self._decoder.finish()
            except ContentCodingError as exc:
                raise unreadable(str(exc)) from None
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)
