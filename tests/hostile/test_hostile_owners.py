"""Row 12 of issue 13: a second API key must not reach the first key's responses.

With several client keys a stored response belongs to the key that created it: another
key gets 404 on GET (and its `stream=true` follow), DELETE, input_items and cancel, and
`previous_response_not_found` (400) when it continues from it, over HTTP and WebSocket,
with the memory and the Redis store. The owner keeps every route; a single-key gateway is
unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from harness import GatewayHarness
from redis_server import RedisServer, redis_server  # noqa: F401 - the module fixture
from scripted_backend import DONE, HANG, text_chunks

KEY_A = "sk-owner-a-000000000000"
KEY_B = "sk-owner-b-111111111111"
STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]
# a follow that is (wrongly) let in would hang on the running turn: fail instead
TIMEOUT = aiohttp.ClientTimeout(total=5)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(params=STORES)
async def gw(request: pytest.FixtureRequest) -> AsyncIterator[GatewayHarness]:
    store = None
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        store = server.url
    async with GatewayHarness(api_keys=(KEY_A, KEY_B), store=store) as harness:
        yield harness


async def create(http: aiohttp.ClientSession, gw: GatewayHarness, key: str, **extra: Any) -> str:
    body = {"model": "m", "input": "hi", **extra}
    async with http.post(gw.url + "/responses", json=body, headers=auth(key)) as resp:
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["id"])


async def status_of(http: aiohttp.ClientSession, url: str, key: str, method: str = "GET") -> int:
    async with http.request(method, url, headers=auth(key)) as resp:
        body = await resp.read()
        if resp.status >= 400:  # every refusal in OpenAI's error shape
            assert set(orjson.loads(body)["error"]) == {"message", "type", "param", "code"}
        return resp.status


async def continue_from(http: aiohttp.ClientSession, gw: GatewayHarness, key: str, rid: str) -> Any:
    body = {"model": "m", "input": "more", "previous_response_id": rid}
    async with http.post(gw.url + "/responses", json=body, headers=auth(key)) as resp:
        return resp.status, await resp.json()


async def ws_continue_from(gw: GatewayHarness, key: str, rid: str) -> dict[str, Any]:
    frame = {"type": "response.create", "model": "m", "input": "more", "previous_response_id": rid}
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.ws_connect(gw.ws_url, headers=auth(key)) as ws,
    ):
        await ws.send_str(orjson.dumps(frame).decode())
        while True:
            event = orjson.loads((await ws.receive(timeout=10)).data)
            if event["type"] in ("response.completed", "response.failed", "error"):
                return event


async def test_another_key_gets_404_on_every_route(gw: GatewayHarness) -> None:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        rid = await create(http, gw, KEY_A)
        url = f"{gw.url}/responses/{rid}"
        assert await status_of(http, url, KEY_B) == 404
        assert await status_of(http, url + "/input_items", KEY_B) == 404
        assert await status_of(http, url + "/cancel", KEY_B, "POST") == 404
        assert await status_of(http, url, KEY_B, "DELETE") == 404
        status, body = await continue_from(http, gw, KEY_B, rid)
        assert status == 400
        assert body["error"]["code"] == "previous_response_not_found"
        event = await ws_continue_from(gw, KEY_B, rid)
        assert event["type"] == "error"
        assert event["error"]["code"] == "previous_response_not_found"
        # the owner still has all of it, B's DELETE took nothing away
        assert await status_of(http, url, KEY_A) == 200
        assert await status_of(http, url + "/input_items", KEY_A) == 200
        status, body = await continue_from(http, gw, KEY_A, rid)
        assert status == 200 and body["status"] == "completed"
        assert (await ws_continue_from(gw, KEY_A, rid))["type"] == "response.completed"
        assert await status_of(http, url, KEY_A, "DELETE") == 200
        assert await status_of(http, url, KEY_A) == 404


async def test_another_key_cannot_follow_or_cancel_a_background_turn(gw: GatewayHarness) -> None:
    gw.backend.script([*text_chunks(["a"]), HANG])
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        rid = await create(http, gw, KEY_A, background=True)
        url = f"{gw.url}/responses/{rid}"
        assert await status_of(http, url + "?stream=true", KEY_B) == 404
        assert await status_of(http, url + "/cancel", KEY_B, "POST") == 404
        assert await status_of(http, url, KEY_B, "DELETE") == 404
        async with http.get(url, headers=auth(KEY_A)) as resp:
            assert (await resp.json())["status"] in ("queued", "in_progress")
        async with http.post(url + "/cancel", headers=auth(KEY_A)) as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == "cancelled"
        async with http.get(url + "?stream=true", headers=auth(KEY_A)) as resp:
            assert resp.status == 200
            assert b'"status":"cancelled"' in await resp.read()  # the replay ends cancelled
        assert await status_of(http, url, KEY_B) == 404


async def test_a_single_key_gateway_is_unchanged() -> None:
    async with (
        GatewayHarness(api_keys=(KEY_A,)) as gw,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        gw.backend.script([*text_chunks(["x"]), DONE])
        rid = await create(http, gw, KEY_A)
        status, body = await continue_from(http, gw, KEY_A, rid)
        assert status == 200 and body["previous_response_id"] == rid
        assert await status_of(http, f"{gw.url}/responses/{rid}/input_items", KEY_A) == 200


async def test_an_open_gateway_is_unchanged() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "hi"}) as resp:
            rid = (await resp.json())["id"]
        for _ in range(2):  # any caller sees it: there is nobody to tell apart
            async with http.get(f"{gw.url}/responses/{rid}") as resp:
                assert resp.status == 200
