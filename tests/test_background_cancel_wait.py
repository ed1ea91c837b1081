"""`--background-cancel-wait`: how long a cancel waits for the instance running a
background turn; past it, the cancelling instance ends the response itself."""

from __future__ import annotations

import asyncio

import aiohttp
from harness import GatewayHarness

from streamer.turns.records import stored


async def test_a_cancel_ends_a_turn_nobody_runs_after_the_set_wait() -> None:
    async with (
        GatewayHarness(background_cancel_wait=0.2) as gw,
        aiohttp.ClientSession() as http,
        asyncio.timeout(20),
    ):
        # A background response left `in_progress` by an instance that is gone: in the
        # store, with no task running it here.
        turn = await gw.gateway.prepare({"model": "m", "input": "hi", "background": True})
        turn.streamer.queued()
        turn.streamer.start()
        await gw.gateway.store.put(stored(turn))
        response_id = turn.response["id"]
        assert response_id not in gw.gateway.background.tasks
        assert gw.gateway.background.cancel_wait == 0.2  # the setting reached it
        async with http.post(f"{gw.url}/responses/{response_id}/cancel") as reply:
            assert reply.status == 200
            body = await reply.json()
    assert body["status"] == "cancelled"
    assert body["error"] is None  # as OpenAI's cancelled responses
