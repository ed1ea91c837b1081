"""Who a request's Authorization header says it is: `--api-key` keys compared in constant
time, and the rule for a header that cannot be a credential at all.

Both are decided from the head alone, before any byte of the body is read, and a refusal
closes the connection (`Connection: close`): nothing is buffered or parsed for a client
that has not shown a key.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from aiohttp import web

from streamer.core.errors import RequestError
from streamer.core.identity import client_identity

CLIENT = web.RequestKey("client", str)  # the request's client identity, set by the auth middleware

CLOSE = {"Connection": "close"}


def refused(message: str) -> RequestError:
    """The 401 of a request without a usable key; the connection closes after it."""
    return RequestError(message, status=401, code="invalid_api_key", headers=dict(CLOSE))


def credential(header: str | None) -> str | None:
    """`header` when it can be a credential (printable ASCII, as every key is), else the
    401: bytes that are not UTF-8 arrive as lone surrogates (the servers decode header
    bytes with `surrogateescape`), and neither a key check nor a forwarded header can use
    them."""
    if header is None or (header.isascii() and header.isprintable()):
        return header
    raise refused("Incorrect API key provided: the Authorization header is not ASCII text.")


class ApiKeys:
    """The client keys; `check` is the one rule both servers apply."""

    __slots__ = ("_encoded",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._encoded = [(k.encode(), client_identity(k)) for k in keys]

    def check(self, header: str | None) -> str:
        """The identity of the key in `header` (`Bearer <key>`), or the 401."""
        header = credential(header) or ""
        token = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
        ok, who = False, ""
        # compare_digest takes as long whatever the bytes, and no key ends the loop
        # early: the answer's timing says nothing about how close a guess was
        for key, identity in self._encoded:
            match = hmac.compare_digest(token, key)
            ok |= match
            who = identity if match else who
        if not ok or not token:
            raise refused(
                "Incorrect API key provided." if token else "You didn't provide an API key."
            )
        return who
