"""Background responses: turns that outlive their request, logged to the store.

The turn runs in a task on the instance that accepted it; every event goes to the
store's log, so any instance can replay and follow it (`GET ...?stream=true`) or ask
to cancel it (the store carries the request to the running instance).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import sse
from .errors import invalid
from .events import Event
from .pipeline import Turn, stream_events
from .store import StoredResponse
from .store.base import event_type

if TYPE_CHECKING:
    from .gateway import Gateway

log = logging.getLogger("streamer.background")


class Background:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def create(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Accept a background turn: stored as queued, then run in its own task."""
        from .http import json_response

        if turn.request.get("store") is False:
            raise invalid("Background responses require 'store' to be true.", "background")
        store = self.gateway.store
        response_id = turn.response["id"]
        queued = turn.streamer.queued()
        await self._put(turn)
        await self._log(response_id, queued)
        task = asyncio.create_task(self._run(turn), name=f"background {response_id}")
        self.tasks[response_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(response_id, None))
        if not turn.request.get("stream"):
            return json_response(turn.response)
        return await follow(request, store, response_id, after=-1)

    async def _run(self, turn: Turn) -> None:
        store = self.gateway.store
        response_id = turn.response["id"]
        events = stream_events(turn, self.gateway.upstream)
        cancel = asyncio.create_task(store.wait_cancel(response_id))
        try:
            first = True
            while True:
                step = asyncio.ensure_future(anext(events))
                await asyncio.wait({step, cancel}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # cancelled: stop the backend now, end `cancelled`
                    step.cancel()
                    with contextlib.suppress(BaseException):
                        await step
                    await events.aclose()
                    await self._log(response_id, turn.streamer.cancel())
                    break
                try:
                    batch = step.result()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # refused before streaming: a failed response
                    if turn.streamer.sequence_number <= 1:
                        await self._log(response_id, turn.streamer.start())
                    await self._log(
                        response_id,
                        turn.streamer.fail(getattr(exc, "code", None) or "server_error", str(exc)),
                    )
                    break
                await self._log(response_id, batch)
                if first:
                    first = False
                    await self._put(turn)  # now in_progress
        except asyncio.CancelledError:  # the gateway is shutting down
            await events.aclose()
            with contextlib.suppress(Exception):
                await self._log(response_id, turn.streamer.fail("server_error", "The gateway shut down."))
            raise
        except Exception:
            log.exception("background response %s failed", response_id)
            await self._log(response_id, turn.streamer.fail("server_error", "Internal error."))
        finally:
            cancel.cancel()
            with contextlib.suppress(Exception):
                await self._put(turn)
                await store.end_events(response_id)

    async def _put(self, turn: Turn) -> None:
        await self.gateway.store.put(StoredResponse(turn.response, turn.items, turn.names.to_json()))

    async def _log(self, response_id: str, events: list[Event]) -> None:
        store = self.gateway.store
        for event in events:
            await store.append_event(response_id, event.seq, event.data)

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Ask whichever instance runs it to cancel; return the response once it ended."""
        store = self.gateway.store
        response = await store.get_response(response_id)
        if response is None:
            return None
        if not response.get("background"):
            raise invalid("Only background responses can be cancelled.", "response_id")
        if response.get("status") in ("queued", "in_progress"):
            await store.request_cancel(response_id)
            async for _ in store.events(response_id, after=-1):
                pass  # returns once the turn logged its terminal event
            response = await store.get_response(response_id) or response
        return response

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        for task in list(self.tasks.values()):
            with contextlib.suppress(BaseException):
                await task


async def follow(
    request: web.Request, store: Any, response_id: str, *, after: int
) -> web.StreamResponse:
    """Replay the logged events after `after`, then follow live ones, as SSE."""
    reply = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await reply.prepare(request)
    async for _seq_no, data in store.events(response_id, after=after):
        await reply.write(sse.encode(Event(event_type(data) or "message", data)))
    await reply.write_eof()
    return reply
