"""`--api-key`: which client key a request's Authorization header carries (constant time)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from aiohttp import web

from streamer.core.errors import RequestError
from streamer.core.identity import client_identity

CLIENT = web.RequestKey("client", str)  # the request's client identity, set by the auth middleware


class ApiKeys:
    """The client keys; `check` is the one rule both servers (aiohttp's and the fast
    path) apply."""

    __slots__ = ("_encoded",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._encoded = [(k.encode(), client_identity(k)) for k in keys]

    def check(self, header: str | None) -> str:
        """The identity of the key in `header` (`Bearer <key>`), or the 401."""
        header = header or ""
        token = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
        ok, who = False, ""
        # compare_digest takes as long whatever the bytes, and no key ends the loop
        # early: the answer's timing says nothing about how close a guess was
        for key, identity in self._encoded:
            match = hmac.compare_digest(token, key)
            ok |= match
            who = identity if match else who
        if not ok or not token:
            raise RequestError(
                "Incorrect API key provided." if token else "You didn't provide an API key.",
                status=401,
                code="invalid_api_key",
            )
        return who
