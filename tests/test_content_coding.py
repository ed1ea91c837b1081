"""Content-Encoding decoders as plain values: every coding, pieces split anywhere, bounded
output per call (decompression bombs), and the errors."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable

import brotli
import pytest

from streamer.upstream.http1.content_coding import (
    MAX_OUTPUT,
    BodyDecoder,
    ContentCodingError,
    UnsupportedCoding,
    decoder_for,
)

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "x-gzip": ("x-gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", raw_deflate),
    "br": ("br", lambda d: brotli.compress(d, quality=5)),
    "zstd": ("zstd", zstd.compress),
    "gzip members": ("gzip", lambda d: gzip.compress(d[:999]) + gzip.compress(d[999:])),
    "zstd frames": ("zstd", lambda d: zstd.compress(d[:999]) + zstd.compress(d[999:])),
    "gzip then br": ("gzip, br", lambda d: brotli.compress(gzip.compress(d), quality=5)),
    "br then zstd": ("BR , Zstd", lambda d: zstd.compress(brotli.compress(d, quality=5))),
}
DATA = os.urandom(200_000) + b"data: " + b"x" * 2_000_000 + b"hello world\n\n" * 20_000


def decode_all(decoder: BodyDecoder, data: bytes, piece: int) -> tuple[bytes, int]:
    """Feed `data` in pieces as `DecodedResponse` does; the decoded body, the largest output."""
    out, largest = [], 0
    for i in range(0, len(data), piece):
        got = decoder.decode(data[i : i + piece])
        while True:
            out.append(got)
            largest = max(largest, len(got))
            if not decoder.pending:
                break
            got = decoder.decode(b"")
    decoder.finish()
    return b"".join(out), largest


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.parametrize("piece", [1, 7, 32 << 10])
def test_every_coding_decodes_split_anywhere(name: str, piece: int) -> None:
    coding, encode = ENCODERS[name]
    data = DATA if piece > 1024 else DATA[:20_000] + DATA[-20_000:]
    decoder = decoder_for(coding)
    assert decoder is not None
    decoded, largest = decode_all(decoder, encode(data), piece)
    assert decoded == data
    assert largest <= MAX_OUTPUT


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_bomb_gives_at_most_max_output_per_call(coding: str) -> None:
    """64 MiB from 64 KiB (gzip) or less: never more than `max_output` per call."""
    bomb = {
        "gzip": gzip.compress(b"\0" * (16 << 20), 9) * 4,
        "br": brotli.compress(b"\0" * (64 << 20), quality=1),
        "zstd": zstd.compress(b"\0" * (16 << 20)) * 4,
    }[coding]
    decoder = decoder_for(coding, max_output=64 << 10)
    assert decoder is not None
    calls, total, largest = 0, 0, 0
    for i in range(0, len(bomb), 32 << 10):
        got = decoder.decode(bomb[i : i + (32 << 10)])
        while True:
            calls += 1
            total += len(got)
            largest = max(largest, len(got))
            if not decoder.pending:
                break
            got = decoder.decode(b"")
    decoder.finish()
    assert total == 64 << 20
    assert largest <= 64 << 10  # br: its blocks are 32 KiB, then 64 KiB
    assert calls >= total // (64 << 10)
    print(f"{coding}: {len(bomb):,} bytes -> {total:,} in {calls:,} calls of <= {largest:,}")


def test_identity_is_no_decoder() -> None:
    assert decoder_for(None) is None
    assert decoder_for("") is None
    assert decoder_for("identity") is None
    assert decoder_for(" Identity , ") is None
    decoder = decoder_for("identity, gzip")
    assert decoder is not None and decoder.name == "gzip"


@pytest.mark.parametrize("header", ["compress", "gzip, compress", "exi", "zstd;q=1"])
def test_unknown_codings_are_named(header: str) -> None:
    with pytest.raises(UnsupportedCoding, match="cannot decode") as info:
        decoder_for(header)
    assert info.value.coding in header


@pytest.mark.parametrize("name", ["gzip", "deflate", "br", "zstd"])
def test_a_body_cut_short_is_an_error_at_its_end(name: str) -> None:
    coding, encode = ENCODERS[name]
    decoder = decoder_for(coding)
    assert decoder is not None
    data = encode(DATA)
    with pytest.raises(ContentCodingError, match="cut short"):
        decode_all(decoder, data[: len(data) // 2], 4096)


@pytest.mark.parametrize("name", ["gzip", "deflate", "br", "zstd"])
def test_garbage_is_an_error(name: str) -> None:
    coding, _ = ENCODERS[name]
    decoder = decoder_for(coding)
    assert decoder is not None
    with pytest.raises(ContentCodingError):
        decode_all(decoder, b"\x1f\x8b garbage, not " + bytes(range(256)) * 4, 64)


@pytest.mark.parametrize(("name", "says"), [("deflate", "after the end"), ("br", "corrupt")])
def test_bytes_after_the_end_are_an_error(name: str, says: str) -> None:
    coding, encode = ENCODERS[name]
    decoder = decoder_for(coding)
    assert decoder is not None
    with pytest.raises(ContentCodingError, match=says):
        decode_all(decoder, encode(b"hello") + b"tail", 1 << 20)


def test_zstd_frames_wanting_a_window_over_8_mib_are_refused() -> None:
    """RFC 9659: an HTTP zstd frame may not make the decoder hold more than 8 MiB."""
    data = os.urandom(1 << 20) * 16
    frame = zstd.compress(data, options={zstd.CompressionParameter.window_log: 25})
    decoder = decoder_for("zstd")
    assert decoder is not None
    with pytest.raises(ContentCodingError, match="too much memory"):
        decode_all(decoder, frame, 32 << 10)


def test_an_empty_body_with_a_coding_is_fine() -> None:
    for coding in ("gzip", "deflate", "br", "zstd"):
        decoder = decoder_for(coding)
        assert decoder is not None
        assert decode_all(decoder, b"", 1) == (b"", 0)
