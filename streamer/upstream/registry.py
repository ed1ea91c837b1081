"""Which upstream serves a request: one interface, today one entry.

The gateway asks the registry, per turn, which backend client runs it (`resolve`), and
goes through it for what is not a turn (`/v1/models`, the `/readyz` probe, shutdown).
Frontends never hold an upstream: the next upstream kinds and replicas are added here.
"""

from __future__ import annotations

from typing import Protocol

from streamer.pipeline import Turn, Upstream
from streamer.upstream.chat.client import ChatUpstream
from streamer.upstream.responses.client import ResponsesUpstream

CLIENTS: dict[str, type[ChatUpstream]] = {"chat": ChatUpstream, "responses": ResponsesUpstream}
"""The client of each `--upstream-api`: one shell, the API's endpoint and decoder."""


class Backend(Upstream, Protocol):
    """An upstream as the gateway uses it: turns (`open`), plus models, probe and close."""

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]: ...
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


def client_class(api: str) -> type[ChatUpstream]:
    """The backend client of `--upstream-api api` (a ValueError for another)."""
    try:
        return CLIENTS[api]
    except KeyError:
        raise ValueError(f"unknown --upstream-api {api!r} (one of {', '.join(CLIENTS)})") from None


class UpstreamRegistry:
    """The upstreams this gateway may send to, and the rule that picks one."""

    __slots__ = ("default",)

    def __init__(self, default: Backend) -> None:
        self.default = default

    def resolve(self, turn: Turn | None = None) -> Backend:
        """The upstream that serves `turn` (or a request with no turn: models, probe)."""
        return self.default

    async def models(self, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """`GET /v1/models` as the backend answers it: status and body."""
        return await self.resolve().get_models(headers=headers)

    async def ping(self) -> bool:
        """Whether every upstream answers (readiness)."""
        return await self.default.ping()

    async def close(self) -> None:
        await self.default.close()
