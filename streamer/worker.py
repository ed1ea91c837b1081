"""One worker of `streamer serve --workers N`: the child side of `streamer.supervisor`.

The supervisor starts `streamer.worker_entry.main` in a new Python and writes one JSON line on its stdin
(`Seat.encode`): the settings, the worker's index, how to listen (bind the port itself
with SO_REUSEPORT, or accept on an inherited listening socket) and the shared state key.
The worker then serves as a single-process gateway does (`streamer.app.serve`), SIGTERM
drain included. Its stdin stays open: end of file means the supervisor is gone, and the
worker drains and exits as on SIGTERM, so no worker outlives its supervisor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import sys
from typing import Any

import orjson
from aiohttp import web

from streamer import logs
from streamer.config import Settings
from streamer.frontends.endpoint import Decorations

WORKER_HEADER = "X-Streamer-Worker"
WORKER_INFO = web.AppKey("worker_info", dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Seat:
    """What one worker is told: its settings, index, listening socket and state key."""

    settings: Settings
    index: int
    workers: int
    fd: int | None = None  # an inherited listening socket; None: bind with SO_REUSEPORT
    state_key: bytes | None = None  # the supervisor's shared key (no --state-key-file)

    def encode(self) -> bytes:
        values = {f.name: getattr(self.settings, f.name) for f in dataclasses.fields(Settings)}
        values.pop("shared_state_key", None)
        return orjson.dumps(
            {
                "settings": values,
                "index": self.index,
                "workers": self.workers,
                "fd": self.fd,
                "state_key": self.state_key.hex() if self.state_key else None,
            }
        )

    @classmethod
    def decode(cls, line: bytes) -> Seat:
        raw = orjson.loads(line)
        defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(defaults.get(k), tuple) and isinstance(v, list) else v
            for k, v in raw["settings"].items()
            if k in defaults
        }
        key = bytes.fromhex(raw["state_key"]) if raw["state_key"] else None
        settings = Settings(**values, shared_state_key=key)
        return cls(settings, raw["index"], raw["workers"], raw["fd"], key)

    def site(self, runner: web.AppRunner) -> web.BaseSite:
        """The worker's listener: its own SO_REUSEPORT socket on the shared port, or the
        supervisor's listening socket."""
        from streamer.frontends.frontdoor import GuardedSite

        s = self.settings
        if self.fd is None:
            return GuardedSite(runner, s.host, s.port, reuse_port=True)
        return GuardedSite(runner, s.host, s.port, sock=socket.socket(fileno=self.fd))

    def attach(self, app: web.Application, decorations: Decorations) -> None:
        """Name the worker in `/healthz`, the `X-Streamer-Worker` header of every answer
        (one of the endpoint's `decorations`) and every log line; drain when the
        supervisor goes away."""
        app[WORKER_INFO] = {"index": self.index, "workers": self.workers, "pid": os.getpid()}
        logs.worker = self.index
        decorations.add(WORKER_HEADER, str(self.index))
        app.on_startup.append(_watch_supervisor)
        app.on_shutdown.insert(0, _stop_watching)


async def _watch_supervisor(app: web.Application) -> None:
    """End of file on stdin: the supervisor died (even by SIGKILL); drain as on SIGTERM."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def watch() -> None:
        while await reader.read(4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    app[_WATCH] = asyncio.create_task(watch(), name="supervisor-watch")


async def _stop_watching(app: web.Application) -> None:
    """Shutting down already: a later end of file must not signal again (a second SIGTERM
    would cut the drain short)."""
    task = app.get(_WATCH)
    if task is not None:
        task.cancel()


_WATCH: web.AppKey[asyncio.Task[Any]] = web.AppKey("supervisor_watch")
