"""At startup, say in the log which backend profile fits the backend (`detect`).

One `GET /models` in the background: bounded in time and size, never delaying or
failing startup, cancelled at shutdown. Whatever goes wrong is one info line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

from streamer.upstream.backend_client import BackendClient
from streamer.upstream.chat.detect import Fit, fitting_profile

log = logging.getLogger("streamer.upstream")

PROBE_SECONDS = 10.0  # at most, the connect timeout if shorter
PROBE_BODY_LIMIT = 1 << 20  # of the model list read (a cut list names no owner: no fit)


class ProfileProbe:
    """The background probe task, for the app to cancel at shutdown."""

    __slots__ = ("task",)

    def __init__(self, chat: BackendClient, configured: str) -> None:
        self.task = asyncio.create_task(probe(chat, configured), name="backend-profile-probe")

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def probe(chat: BackendClient, configured: str) -> Fit | None:
    """Ask the backend for its models; log the profile that fits if it is not `configured`."""
    parts = urlsplit(chat.base_url)
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    try:
        async with asyncio.timeout(min(PROBE_SECONDS, chat.connect_timeout)):
            status, headers, body = await chat.models_answer(PROBE_BODY_LIMIT)
    except Exception as exc:  # a probe: it must never take the gateway down
        log.info("could not ask the backend at %s what it is: %s", where, exc or type(exc).__name__)
        return None
    fit = fitting_profile(chat.base_url, headers, status, body)
    if fit is None:
        log.info("the backend at %s does not say which profile fits it", where)
    elif fit.profile != configured:
        log.warning(
            "the backend at %s looks like %s (%s): --backend-profile %s fits it (configured: %s)",
            where,
            fit.profile,
            fit.reason,
            fit.profile,
            configured,
        )
    return fit
