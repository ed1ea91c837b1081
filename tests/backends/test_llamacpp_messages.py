"""The gateway in `--upstream-api anthropic` before the real llama.cpp `/v1/messages`.

llama-server converts a Messages request to its Chat one (tools/server/server-chat.cpp
`server_chat_convert_anthropic_to_oai`) and streams Anthropic's events back, with its own
ways: every block's `content_block_stop` after the last block's deltas, a `tool_use` start
without `input`, the prompt's cached tokens as `cache_read_input_tokens`, thinking with an
empty signature. The gateway flattens the namespaces, restores them on the way back, keeps
the state and replays the calls as `tool_use` / `tool_result` blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets
from openai import AsyncOpenAI
from sdk_models import validate_event
from test_llamacpp import GREEDY, MIXED, ONE_NAMESPACE, called, calls, declared, streamed_any

pytestmark = pytest.mark.backends
MESSAGES: dict[str, Any] = {"upstream_api": "anthropic", "backend_profile": "llamacpp"}


def _client(gw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0, timeout=120)


def _sent(tap: Path) -> list[dict[str, Any]]:
    """The Messages requests the gateway sent, from its recordings, shortest history first
    (each turn here extends the one before; file names order only by the second)."""
    out = []
    for path in tap.iterdir():
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if record.get("kind") == "backend_request":
                out.append(record["body"])
    return sorted(out, key=lambda body: len(body["messages"]))


async def test_text_through_messages(llama_server: str, recorded: Any) -> None:
    async with recorded(llama_server, **MESSAGES) as gw, _client(gw) as client:
        response = await streamed_any(client, input="Say something.", max_output_tokens=16)
    (message,) = [item for item in response.output if item.type == "message"]
    assert response.output_text == message.content[0].text != ""
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.status == "incomplete"  # 16 tokens of a random model: `max_tokens`


async def test_namespaced_calls_come_back_with_their_namespace(
    llama_server: str, recorded: Any
) -> None:
    async with recorded(llama_server, **MESSAGES) as gw, _client(gw) as client:
        response = await streamed_any(
            client, input="Do it.", tools=MIXED, tool_choice="required", **GREEDY
        )
    assert called(response) <= declared(MIXED)
    assert any(namespace for namespace, _ in called(response))


async def test_the_call_is_replayed_as_tool_use_and_tool_result(
    llama_server: str, recorded: Any, tmp_path: Path
) -> None:
    """Turn 1 calls the namespaced tool; turn 2 (`store: false`, the client's own items)
    sends the call and its output back: llama.cpp takes the tool_use / tool_result pair."""
    async with recorded(llama_server, **MESSAGES) as gw, _client(gw) as client:
        first = await streamed_any(
            client, input="Search.", tools=ONE_NAMESPACE, tool_choice="required", store=False,
            **GREEDY,
        )  # fmt: skip
        done = [c for c in calls(first, ONE_NAMESPACE) if c.status == "completed"]
        assert done, first.model_dump_json()
        history = [{"role": "user", "content": "Search."}]
        history += [c.model_dump(exclude_none=True) for c in done]
        history += [
            {"type": "function_call_output", "call_id": c.call_id, "output": "nothing found"}
            for c in done
        ]
        second = await streamed_any(
            client, input=history, tools=ONE_NAMESPACE, store=False, max_output_tokens=16
        )
    assert second.status in ("completed", "incomplete")
    replay = _sent(tmp_path / "tap-0")[-1]["messages"]
    assert [m["role"] for m in replay] == ["user", "assistant", "user"]
    uses = [b for b in replay[1]["content"] if b["type"] == "tool_use"]
    results = replay[2]["content"]
    assert [u["name"] for u in uses] == ["mcp__docs__search"] * len(done)
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
    assert all(r["type"] == "tool_result" for r in results)


async def test_websocket_through_messages(llama_server: str, recorded: Any) -> None:
    async with recorded(llama_server, **MESSAGES) as gw:
        frame = {"type": "response.create", "model": "tiny", "input": "Hi.", "tools": ONE_NAMESPACE,
                 "tool_choice": "required", **GREEDY}  # fmt: skip
        async with websockets.connect(gw.ws_url, open_timeout=10) as ws:
            await ws.send(orjson.dumps(frame).decode())
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] not in (
                "response.completed",
                "response.incomplete",
            ):
                events.append(orjson.loads(await ws.recv()))
                validate_event(events[-1])
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert {(i.get("namespace"), i["name"]) for i in done if i["type"] == "function_call"} == {
        ("mcp__docs", "search")
    }


async def test_thinking_streams_as_reasoning_and_goes_back_unsigned(
    llama_thinking_server: str, recorded: Any, tmp_path: Path
) -> None:
    """A thinking template: llama.cpp's thinking block (its signature empty) is a reasoning
    item; the next turn sends its text back as a thinking block (the profile reads those)."""
    async with recorded(llama_thinking_server, **MESSAGES) as gw, _client(gw) as client:
        first = await streamed_any(
            client, input="Think.", max_output_tokens=24, reasoning={"effort": "low"}, store=False
        )
        reasoning = [i for i in first.output if i.type == "reasoning"]
        assert reasoning and reasoning[0].content and reasoning[0].content[0].text
        history = [
            {"role": "user", "content": "Think."},
            reasoning[0].model_dump(exclude_none=True),
        ]
        history.append({"role": "assistant", "content": "ok"})
        history.append({"role": "user", "content": "Again."})
        await streamed_any(client, input=history, max_output_tokens=16, store=False)
    sent = _sent(tmp_path / "tap-0")
    assert "thinking" not in sent[0]  # 24 tokens leave no room for the least budget
    thought = sent[-1]["messages"][1]["content"][0]
    assert thought == {
        "type": "thinking",
        "thinking": reasoning[0].content[0].text,
        "signature": "",
    }
