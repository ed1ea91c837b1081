"""`truncation: "auto"` (issue 17): on the backend's context overflow the gateway drops the
oldest items (never a system/developer message, never half of a call and its output) and
retries once; `disabled` keeps the error. The planning (pure), then end to end with the SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, Status, finish, text_chunks, usage
from test_tap_record import tap

from streamer.core.truncation import DEFAULT_KEEP, MARGIN, keep_share, truncate

TEXT = [*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE]
VLLM_OVERFLOW = (
    "This model's maximum context length is 4096 tokens. However, you requested 8192 tokens "
    "(7192 in the messages, 1000 in the completion). Please reduce the length of the messages."
)
LLAMACPP_OVERFLOW = "request (8192 tokens) exceeds the available context size (4096 tokens)"


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": text}


def developer(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "developer", "content": text}


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "exec_command", "arguments": "{}"}


def output(call_id: str, text: str = "done") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


HISTORY = [
    developer("Be brief."),
    user("first " * 50),
    call("c1"),
    output("c1", "x" * 400),
    assistant("answer one " * 20),
    user("second " * 50),
    call("c2"),
    output("c2", "y" * 400),
    assistant("answer two"),
    user("third"),
]


# -- planning ------------------------------------------------------------------------------


def test_the_oldest_go_first_and_the_system_message_stays() -> None:
    kept = truncate(HISTORY, 0.5)
    assert kept is not None
    assert kept[0] == developer("Be brief.")
    assert kept[-1] == user("third")
    assert HISTORY[1] not in kept  # the oldest user turn went
    assert len(kept) < len(HISTORY)
    assert [i for i in kept if i in HISTORY] == kept  # order kept


@pytest.mark.parametrize("keep", [0.05, 0.2, 0.4, 0.6, 0.8])
def test_a_call_and_its_output_go_together(keep: float) -> None:
    kept = truncate(HISTORY, keep)
    assert kept is not None
    calls = {i["call_id"] for i in kept if i["type"] == "function_call"}
    outputs = {i["call_id"] for i in kept if i["type"] == "function_call_output"}
    assert calls == outputs
    assert developer("Be brief.") in kept


def test_a_call_whose_output_is_the_newest_item_stays_with_it() -> None:
    items = [user("a" * 500), call("c9"), user("b" * 500), output("c9")]
    kept = truncate(items, 0.05)
    assert kept == [call("c9"), user("b" * 500), output("c9")]


def test_nothing_to_drop_is_no_retry() -> None:
    assert truncate([developer("d"), user("only")], 0.1) is None
    assert truncate([user("a"), user("b")], 1.0) is None  # already within the share


def test_the_share_is_read_from_the_backends_message() -> None:
    # vLLM: 7192 in the messages, 4096 left after 1000 of completion: keep (7192-4096)/7192
    assert keep_share(VLLM_OVERFLOW) == pytest.approx((7192 - 4096) / 7192 * MARGIN)
    assert keep_share(LLAMACPP_OVERFLOW) == pytest.approx(4096 / 8192 * MARGIN)
    assert keep_share("prompt too long") == DEFAULT_KEEP  # Ollama says no numbers


# -- end to end ----------------------------------------------------------------------------


def _overflow() -> Status:
    body = {"object": "error", "message": VLLM_OVERFLOW, "type": "BadRequestError", "code": 400}
    return Status(400, body)


async def test_auto_truncation_retries_once_with_the_oldest_items_dropped() -> None:
    async with GatewayHarness() as gw, AsyncOpenAI(base_url=gw.url, api_key="k") as sdk:
        gw.backend.script([_overflow()], TEXT)
        response = await sdk.responses.create(
            model="m", instructions="You are terse.", input=HISTORY, truncation="auto"
        )
    assert response.status == "completed"
    assert response.output_text == "ok"
    assert response.truncation == "auto"
    first, second = gw.backend.requests
    assert len(second["messages"]) < len(first["messages"])
    assert second["messages"][0] == first["messages"][0]  # instructions + developer, merged
    assert second["messages"][0]["content"] == "You are terse.\n\nBe brief."
    assert second["messages"][-1] == {"role": "user", "content": "third"}
    answered = {m["tool_call_id"] for m in second["messages"] if m["role"] == "tool"}
    asked = {
        c["id"]
        for m in second["messages"]
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    }
    assert answered == asked


async def test_disabled_truncation_keeps_the_error() -> None:
    async with GatewayHarness() as gw, AsyncOpenAI(base_url=gw.url, api_key="k") as sdk:
        gw.backend.script([_overflow()], TEXT)
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="m", input=HISTORY)  # disabled is the default
    assert caught.value.code == "context_length_exceeded"
    assert len(gw.backend.requests) == 1


async def test_auto_truncation_retries_only_once() -> None:
    async with (
        GatewayHarness() as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        gw.backend.script([_overflow()], [_overflow()], TEXT)
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="m", input=HISTORY, truncation="auto")
    assert caught.value.code == "context_length_exceeded"
    assert len(gw.backend.requests) == 2


async def test_auto_truncation_over_a_stream() -> None:
    async with GatewayHarness() as gw, AsyncOpenAI(base_url=gw.url, api_key="k") as sdk:
        gw.backend.script([_overflow()], TEXT)
        stream = await sdk.responses.create(
            model="m", input=HISTORY, truncation="auto", stream=True
        )
        events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert len(gw.backend.requests) == 2


async def test_the_recording_holds_the_request_sent_again(tmp_path: Path) -> None:
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(tap_dir=str(tap_dir)) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k") as sdk,
    ):
        gw.backend.script([_overflow()], TEXT)
        await sdk.responses.create(model="m", input=HISTORY, truncation="auto")
    (path,) = tap_dir.iterdir()
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    sent = [line["body"]["messages"] for line in lines if line["kind"] == "backend_request"]
    assert sent == [b["messages"] for b in gw.backend.requests]  # the first, then the truncated
    status, output = await tap(path)
    assert status == 0, output
