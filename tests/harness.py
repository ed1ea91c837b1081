"""A real gateway on loopback in front of a real scripted backend, for integration tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web
from scripted_backend import ScriptedBackend

from streamer.app import create_app
from streamer.config import Settings
from streamer.frontends.frontdoor import GuardedSite
from streamer.frontends.http import GATEWAY
from streamer.turns.gateway import Gateway


class GatewayHarness:
    """`async with GatewayHarness() as gw:` gives `gw.url` (…/v1), `gw.backend`, `gw.gateway`."""

    def __init__(
        self,
        settings: Settings | None = None,
        backend: ScriptedBackend | None = None,
        **overrides: Any,
    ) -> None:
        self.backend = backend or ScriptedBackend()
        # no startup profile probe unless asked: tests count the backend's requests
        self.settings = replace(settings or Settings(), **{"profile_probe": False, **overrides})
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> GatewayHarness:
        settings = self.settings
        if settings.upstream is None:
            settings = replace(settings, upstream=await self.backend.start())
        self.settings = settings
        self.runner = web.AppRunner(create_app(settings), handler_cancellation=True)
        await self.runner.setup()
        site = GuardedSite(self.runner, "127.0.0.1", 0)  # the front door `serve` has
        await site.start()
        self.url = f"http://127.0.0.1:{site.port}/v1"
        return self

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/responses"

    @property
    def gateway(self) -> Gateway:
        assert self.runner is not None
        return self.runner.app[GATEWAY]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.backend.stop()

    async def __aenter__(self) -> GatewayHarness:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
