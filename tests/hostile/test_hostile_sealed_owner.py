"""Row 8 of issue 25: sealed `encrypted_content` is bound to the client that got it.

Tenant B replayed tenant A's compaction item and got 200: A's summary was shown to B's
model and came back to B. A blob now opens only for the client it was sealed for (the
owner's digest is in the AES-GCM associated data): another key's compaction or reasoning
item is a 400 `invalid_encrypted_content` whose message is the one any blob that does not
open gets (nothing says whose it was). A gateway without keys has one owner. Real gateway
on loopback, the embedded scripted model behind it, the official SDK in front.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI, BadRequestError

from streamer.scripted_model import start_scripted_model

KEY_A = "sk-tenant-a-0000000000000000"
KEY_B = "sk-tenant-b-1111111111111111"
SECRET = "the launch code is 4417"
HISTORY = [
    {"role": "user", "content": f"Remember this: {SECRET}."},
    {"role": "assistant", "content": "Noted."},
]


@pytest.fixture
async def model_url() -> AsyncIterator[str]:
    runner, url = await start_scripted_model()
    yield url
    await runner.cleanup()


def sdk(gw: GatewayHarness, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key=key, max_retries=0)


async def compaction_item(gw: GatewayHarness, key: str) -> dict[str, Any]:
    async with sdk(gw, key) as client:
        compacted = await client.responses.compact(model="m", input=HISTORY)  # type: ignore[arg-type]
    item = compacted.output[-1].model_dump(exclude_none=True)
    assert item["type"] == "compaction"
    return item


async def reasoning_item(gw: GatewayHarness, key: str) -> dict[str, Any]:
    """A reasoning item as a stateless client keeps it: only its sealed form."""
    async with sdk(gw, key) as client:
        answer = await client.responses.create(
            model="m",
            input=f"Think about {SECRET}",
            reasoning={"effort": "low"},
            include=["reasoning.encrypted_content"],
            store=False,
        )
    (item,) = [i.model_dump(exclude_none=True) for i in answer.output if i.type == "reasoning"]
    item.pop("content", None)
    assert item["encrypted_content"]
    return item


def tampered(item: dict[str, Any]) -> dict[str, Any]:
    blob = item["encrypted_content"]
    raw = bytearray(base64.urlsafe_b64decode(blob[5:] + "=="))
    raw[20] ^= 1
    return {
        **item,
        "encrypted_content": "stm1_" + base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }


async def replay(gw: GatewayHarness, key: str, item: dict[str, Any]) -> str | dict[str, Any]:
    """The text of the answer to `item` then a question, or the 400's error body."""
    items = [item, {"role": "user", "content": "What was it?"}]
    async with sdk(gw, key) as client:
        try:
            answer = await client.responses.create(model="m", input=items, store=False)  # type: ignore[arg-type]
        except BadRequestError as exc:
            assert isinstance(exc.body, dict)
            return exc.body
    return answer.output_text


MAKERS = {"compaction": compaction_item, "reasoning": reasoning_item}


@pytest.mark.parametrize("kind", MAKERS)
async def test_another_tenants_sealed_item_is_a_400_like_any_bad_blob(
    model_url: str, kind: str
) -> None:
    async with GatewayHarness(upstream=model_url, api_keys=(KEY_A, KEY_B)) as gw:
        item = await MAKERS[kind](gw, KEY_A)
        assert SECRET not in str(item)
        own = await replay(gw, KEY_A, item)
        assert isinstance(own, str) and "What was it?" in own  # A gets its own item back
        stolen = await replay(gw, KEY_B, item)
        spoilt = await replay(gw, KEY_B, tampered(item))
    print(f"\n{kind}, B replaying A's: {stolen}")
    assert isinstance(stolen, dict) and SECRET not in str(stolen)
    assert stolen["code"] == "invalid_encrypted_content"
    assert stolen["type"] == "invalid_request_error"
    assert stolen["param"] == "input[0].encrypted_content"
    assert stolen == spoilt  # the same 400 as an altered blob: nothing says whose it was


@pytest.mark.parametrize("kind", MAKERS)
async def test_without_keys_every_client_is_one_owner(model_url: str, kind: str) -> None:
    async with GatewayHarness(upstream=model_url) as gw:
        item = await MAKERS[kind](gw, "anyone")
        again = await replay(gw, "someone-else", item)
    assert isinstance(again, str) and "What was it?" in again
