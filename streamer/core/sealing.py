"""Sealed `encrypted_content`: what the gateway must get back to restore an item (pure).

A compaction item carries its summary, a reasoning item (when the client asks for
`include: ["reasoning.encrypted_content"]`) its reasoning text, sealed with AES-256-GCM
under the gateway's state key (`--state-key-file`; without it a random key per process).
The blob's kind (`compaction`, `reasoning`) and its owner (the digest of the client it was
made for, `Turn.client`: "" for a gateway without keys) are bound to it as associated
data, so a reasoning blob never opens as a compaction, nor one client's blob for another
(OpenAI binds these to the organisation). A blob that does not open (another key, another
client's, tampered, truncated, not ours, too long) is a 400 naming the item's field, never
a drop; whose it was is never said (another client's gets what an altered one gets).

Blob: `stm1_` + base64url(nonce(12) || ciphertext || tag(16)), no padding. The plaintext
is a JSON object (`{"summary": …}`, `{"text": …}`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import orjson

from streamer.core.errors import RequestError, invalid

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger("streamer.sealing")

Kind = Literal["compaction", "reasoning"]
REASONING_INCLUDE = "reasoning.encrypted_content"

PREFIX = "stm1_"
NONCE_BYTES = 12
MIN_SECRET_BYTES = 32
MAX_PLAIN_BYTES = 3 * 1024 * 1024
"""What one blob holds at most (its JSON): longer text is cut, its end kept, when sealed."""
EPHEMERAL_KEY = (
    "encrypted_content (compaction, reasoning) is sealed with a random key of this process; "
    "after a restart, or on another instance, such items cannot be opened (give every "
    "instance the same --state-key-file)"
)
MAX_SEALED_CHARS = len(PREFIX) + (MAX_PLAIN_BYTES + NONCE_BYTES + 16 + 2) // 3 * 4
"""The longest `encrypted_content` the gateway opens (about 4 MiB; a 400 beyond): the
longest it makes."""


class Sealer:
    """Seals and opens `encrypted_content` blobs with one AES-256-GCM key."""

    __slots__ = ("_aead", "_key", "_nonce", "_warn", "ephemeral")

    def __init__(
        self,
        key: bytes,
        *,
        ephemeral: bool = False,
        nonce: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if len(key) != 32:
            raise ValueError("the state key must be 32 bytes")
        self._key = key
        self._aead: AESGCM | None = None  # made on first use: `cryptography` costs ~8 MB
        self._nonce = nonce
        self.ephemeral = ephemeral  # a random key of this process only
        self._warn = ephemeral  # said in the log when it first seals something

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead = AESGCM(self._key)
        return self._aead

    @classmethod
    def random(cls) -> Sealer:
        return cls(os.urandom(32), ephemeral=True)  # what AESGCM.generate_key(256) does

    @classmethod
    def from_secret(cls, secret: bytes) -> Sealer:
        """The key of a state key file's secret (its SHA-256, surrounding whitespace aside)."""
        secret = secret.strip()
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the state key file must hold at least {MIN_SECRET_BYTES} bytes of secret "
                f"(it holds {len(secret)}); e.g. `head -c 32 /dev/urandom | base64 > FILE`"
            )
        return cls(hashlib.sha256(b"streamer state key\0" + secret).digest())

    def seal(
        self,
        kind: Kind,
        field: str,
        text: str,
        extra: Mapping[str, str] | None = None,
        *,
        owner: str = "",
    ) -> str:
        """`{field: text, **extra}` sealed as a `kind` blob of `owner` (`text` cut to
        `MAX_PLAIN_BYTES`); it opens only for the same owner.

        `extra`: more fields kept with it (a Responses backend's own `encrypted_content`)."""
        more = dict(extra or {})
        plain = orjson.dumps({field: text, **more})
        while len(plain) > MAX_PLAIN_BYTES and text:
            text = text[-(len(text) * 3 // 4) :]
            plain = orjson.dumps({field: "[…earlier text cut]\n" + text, **more})
        if self._warn:
            self._warn = False
            log.warning("no --state-key-file: %s", EPHEMERAL_KEY)
        nonce = self._nonce(NONCE_BYTES)
        sealed = self._cipher().encrypt(nonce, plain, _aad(kind, owner))
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode()

    def open(self, kind: Kind, field: str, blob: Any, param: str, *, owner: str = "") -> str:
        """The text sealed in `blob` under `field` for `owner`, or a 400 naming `param`."""
        return self.open_fields(kind, field, blob, param, owner=owner)[field]

    def open_fields(
        self, kind: Kind, field: str, blob: Any, param: str, *, owner: str = ""
    ) -> dict[str, Any]:
        """Every field sealed in `blob` (`field` among them) for `owner`, or a 400 naming
        `param`."""
        if blob is None:
            raise invalid(
                f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
            )
        if not isinstance(blob, str):
            raise invalid(f"Invalid type for '{param}': expected a string.", param, "invalid_type")
        if len(blob) > MAX_SEALED_CHARS:
            raise _unopenable(param, f"it is longer than {MAX_SEALED_CHARS} characters")
        if not blob.startswith(PREFIX):
            raise _unopenable(param, "it was not made by this gateway")
        body = blob[len(PREFIX) :]
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise _unopenable(param, "it is not valid base64url") from None
        if len(raw) < NONCE_BYTES + 16:
            raise _unopenable(param, "it is truncated")
        from cryptography.exceptions import InvalidTag

        try:
            plain = self._cipher().decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(kind, owner))
        except InvalidTag:
            raise _unopenable(
                param,
                f"it is not a {kind} item this gateway sealed for this client "
                "(another state key, another client's, altered or truncated)",
            ) from None
        fields = orjson.loads(plain)  # only ever written by `seal`
        if not isinstance(fields.get(field), str):
            raise _unopenable(param, f"it holds no {field}")
        return dict(fields)


def _aad(kind: Kind, owner: str) -> bytes:
    """What a blob is bound to besides the key: its kind and its owner (v2: v1 had no owner,
    so its blobs no longer open)."""
    return b"streamer encrypted_content v2 " + kind.encode() + b"\0" + owner.encode()


def _unopenable(param: str, why: str) -> RequestError:
    return invalid(
        f"Invalid '{param}': the encrypted content could not be opened: {why}.",
        param,
        "invalid_encrypted_content",
    )


def load_sealer(path: str | None) -> Sealer:
    """The sealer of `--state-key-file`, or a random one for this process only."""
    if not path:
        return Sealer.random()
    with open(path, "rb") as fh:
        return Sealer.from_secret(fh.read())
