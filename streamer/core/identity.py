"""Who is asking: a digest of the client's key, never the key itself.

With several client keys, backend connections are pooled per client (a backend that
desynchronises a connection can then only answer a client with its own words) and a stored
response belongs to the client that created it. "" is the anonymous client of a gateway that
takes no keys. Pure: the request key that carries it is `frontends/api_keys.CLIENT`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def client_identity(secret: str) -> str:
    """A stable name for a client key or Authorization value that does not reveal it."""
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


def request_client(
    authenticated: str | None, headers: Mapping[str, str], *, forward_authorization: bool
) -> str:
    """The identity behind a request: its matched client key, else (when the gateway forwards
    it) its Authorization header, else ""."""
    if authenticated:
        return authenticated
    if forward_authorization:
        auth = headers.get("Authorization")
        if auth:
            return client_identity(auth)
    return ""
