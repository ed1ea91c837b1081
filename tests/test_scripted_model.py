"""The embedded scripted model, driven over real HTTP on loopback with aiohttp."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from streamer.scripted_model import start_scripted_model

FIXTURES = Path(__file__).parent / "codex" / "fixtures"


def fn(
    name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None
) -> dict:
    params = {"type": "object", "properties": properties or {}, "required": required or []}
    return {"type": "function", "function": {"name": name, "description": "", "parameters": params}}


ECHO = fn("mcp__probe__echo_marker", {"text": {"type": "string"}}, ["text"])
SEARCH = fn(
    "mcp__docs__search",
    {"query": {"type": "string"}, "limit": {"type": "integer"}},
    ["query", "limit"],
)
FETCH = fn(
    "mcp__web__fetch", {"url": {"type": "string"}, "raw": {"type": "boolean"}}, ["url", "raw"]
)
EXEC = fn("exec_command", {"cmd": {"type": "string"}}, ["cmd"])


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.fixture
async def session() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    runner, base = await start_scripted_model()
    try:
        async with aiohttp.ClientSession() as client:
            yield client, base
    finally:
        await runner.cleanup()


async def stream(session: tuple[aiohttp.ClientSession, str], **body: Any) -> list[dict[str, Any]]:
    """POST a streaming request; returns the decoded chunks, checking the `[DONE]` ending."""
    client, base = session
    body = {"model": "m", "stream": True, **body}
    async with client.post(f"{base}/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = (await resp.read()).decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    return [orjson.loads(f[len("data: ") :]) for f in frames[:-1]]


def deltas(chunks: list[dict[str, Any]], key: str) -> list[Any]:
    return [
        c["choices"][0]["delta"][key]
        for c in chunks
        if c["choices"] and key in c["choices"][0]["delta"]
    ]


def finish(chunks: list[dict[str, Any]]) -> str:
    reasons = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert len(reasons) == 1
    return reasons[0]


def calls(chunks: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """Reassemble streamed tool calls by index, like a Chat client does."""
    out: dict[int, dict[str, str]] = {}
    for piece in deltas(chunks, "tool_calls"):
        for tc in piece:
            call = out.setdefault(
                tc["index"], {"id": "", "name": "", "arguments": "", "fragments": 0}
            )
            call["id"] += tc.get("id") or ""
            call["name"] += tc.get("function", {}).get("name") or ""
            if tc.get("function", {}).get("arguments"):
                call["arguments"] += tc["function"]["arguments"]
                call["fragments"] += 1
    return out


async def test_text_is_streamed_word_by_word(session) -> None:
    chunks = await stream(
        session, messages=[{"role": "system", "content": "Be brief."}, user("hello there, model")]
    )
    pieces = deltas(chunks, "content")
    assert "".join(pieces) == "You said: hello there, model"
    assert [p for p in pieces if p] == ["You ", "said: ", "hello ", "there, ", "model"]
    assert deltas(chunks, "reasoning_content") == []
    assert finish(chunks) == "stop"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"m"}


async def test_content_parts_and_reasoning_effort(session) -> None:
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
    }
    chunks = await stream(session, messages=[message], reasoning_effort="low")
    kinds = [
        k for c in chunks for k in c["choices"][0]["delta"] if k in ("reasoning_content", "content")
    ]
    reasoning = deltas(chunks, "reasoning_content")
    assert reasoning and "".join(reasoning).strip()
    first_text = next(i for i, c in enumerate(chunks) if c["choices"][0]["delta"].get("content"))
    last_thought = max(
        i for i, c in enumerate(chunks) if "reasoning_content" in c["choices"][0]["delta"]
    )
    assert last_thought < first_text, kinds
    assert "".join(deltas(chunks, "content")) == "You said: two parts"


async def test_tool_call_from_flat_namespaced_name(session) -> None:
    chunks = await stream(
        session,
        messages=[user("Call the echo_marker tool with text hello")],
        tools=[EXEC, ECHO, SEARCH],
    )
    got = calls(chunks)
    assert list(got) == [0]
    assert got[0]["name"] == "mcp__probe__echo_marker"
    assert got[0]["id"].startswith("call_")
    assert got[0]["fragments"] > 1
    assert orjson.loads(got[0]["arguments"]) == {"text": "hello"}
    assert finish(chunks) == "tool_calls"
    assert "".join(deltas(chunks, "content")) == ""


async def test_full_flat_name_and_quoted_argument(session) -> None:
    chunks = await stream(
        session,
        messages=[user('please use mcp__docs__search for "namespace tools"')],
        tools=[SEARCH, ECHO],
    )
    got = calls(chunks)
    assert [c["name"] for c in got.values()] == ["mcp__docs__search"]
    assert orjson.loads(got[0]["arguments"]) == {"query": "namespace tools", "limit": 1}


async def test_tool_names_in_system_text_do_not_trigger(session) -> None:
    system = "You may call mcp__probe__echo_marker, echo_marker, exec_command or search."
    chunks = await stream(
        session,
        messages=[{"role": "system", "content": system}, user("just say hi")],
        tools=[ECHO, EXEC, SEARCH],
    )
    assert calls(chunks) == {}
    assert "".join(deltas(chunks, "content")) == "You said: just say hi"
    assert finish(chunks) == "stop"


async def test_only_the_last_user_message_counts(session) -> None:
    messages = [
        user("call echo_marker with text old"),
        {"role": "assistant", "content": "ok"},
        user("thanks"),
    ]
    chunks = await stream(session, messages=messages, tools=[ECHO])
    assert calls(chunks) == {}
    assert "".join(deltas(chunks, "content")) == "You said: thanks"


async def test_tool_result_becomes_text(session) -> None:
    messages = [
        user("Call the echo_marker tool with text hello"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "mcp__probe__echo_marker", "arguments": "{}"},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "Wall time: 0.001 seconds\nOutput:\nPROBE-MARKER:hello",
        },
    ]
    chunks = await stream(session, messages=messages, tools=[ECHO])
    assert calls(chunks) == {}
    text = "".join(deltas(chunks, "content"))
    assert text == "Tool result: Wall time: 0.001 seconds Output: PROBE-MARKER:hello"
    assert finish(chunks) == "stop"


async def test_long_tool_result_is_quoted_briefly(session) -> None:
    messages = [
        user("go"),
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "x" * 1000}]},
    ]
    text = "".join(deltas(await stream(session, messages=messages), "content"))
    assert text == "Tool result: " + "x" * 200


async def test_two_tools_give_two_parallel_calls(session) -> None:
    chunks = await stream(
        session,
        messages=[user('call search with "streams" and fetch with url "http://x.test/a"')],
        tools=[ECHO, FETCH, SEARCH],
    )
    got = calls(chunks)
    assert [got[i]["name"] for i in sorted(got)] == ["mcp__docs__search", "mcp__web__fetch"]
    assert got[0]["id"] != got[1]["id"]
    assert orjson.loads(got[0]["arguments"]) == {"query": "streams", "limit": 1}
    assert orjson.loads(got[1]["arguments"]) == {"url": "http://x.test/a", "raw": True}
    assert finish(chunks) == "tool_calls"


async def test_parallel_tool_calls_false_gives_one_call(session) -> None:
    chunks = await stream(
        session,
        messages=[user("call search and fetch")],
        tools=[FETCH, SEARCH],
        parallel_tool_calls=False,
    )
    assert [c["name"] for c in calls(chunks).values()] == ["mcp__docs__search"]


async def test_custom_wrapper_input_and_unquoted_fallback(session) -> None:
    patch = fn("functions__apply_patch", {"input": {"type": "string"}})
    chunks = await stream(session, messages=[user("run apply_patch now")], tools=[patch])
    got = calls(chunks)
    assert got[0]["name"] == "functions__apply_patch"
    assert orjson.loads(got[0]["arguments"]) == {"input": "run apply_patch now"}


async def test_tool_choice_none_and_required(session) -> None:
    none = await stream(
        session, messages=[user("call echo_marker")], tools=[ECHO], tool_choice="none"
    )
    assert calls(none) == {}
    required = await stream(
        session, messages=[user("anything")], tools=[SEARCH, ECHO], tool_choice="required"
    )
    assert [c["name"] for c in calls(required).values()] == ["mcp__docs__search"]


async def test_codex_developer_prompt_and_tools(session) -> None:
    """The real Codex base prompt mentions many tool names; only the user's request counts."""
    captured = orjson.loads((FIXTURES / "http_request.json").read_bytes())
    prompt = captured["input"][0]["content"][0]["text"]
    flat = [(t["name"], t["parameters"]) for t in captured["tools"] if t["type"] == "function"]
    for ns in (t for t in captured["tools"] if t["type"] == "namespace"):
        flat += [(f"{ns['name']}__{c['name']}", c["parameters"]) for c in ns["tools"]]
    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in flat]
    system = {"role": "system", "content": prompt}
    plain = await stream(session, messages=[system, user("What is 2+2?")], tools=tools)
    assert calls(plain) == {}
    asked = await stream(
        session, messages=[system, user("Call the echo_marker tool with text hello")], tools=tools
    )
    got = calls(asked)
    assert [c["name"] for c in got.values()] == ["mcp__probe__echo_marker"]
    assert orjson.loads(got[0]["arguments"]) == {"text": "hello"}


async def test_non_streaming_json(session) -> None:
    client, base = session
    body = {"model": "m", "messages": [user("hello")], "reasoning_effort": "high"}
    async with client.post(f"{base}/chat/completions", json=body) as resp:
        assert resp.status == 200
        text = await resp.json()
    assert text["object"] == "chat.completion"
    choice = text["choices"][0]
    assert choice["message"]["content"] == "You said: hello"
    assert choice["message"]["reasoning_content"]
    assert choice["finish_reason"] == "stop"
    assert text["usage"]["completion_tokens"] > 0

    body = {"model": "m", "messages": [user("call echo_marker with text hi")], "tools": [ECHO]}
    async with client.post(f"{base}/chat/completions", json=body) as resp:
        called = await resp.json()
    choice = called["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (tc,) = choice["message"]["tool_calls"]
    assert tc["function"]["name"] == "mcp__probe__echo_marker"
    assert orjson.loads(tc["function"]["arguments"]) == {"text": "hi"}


async def test_usage_chunk_only_when_asked(session) -> None:
    messages = [{"role": "system", "content": "one two three"}, user("four five")]
    with_usage = await stream(session, messages=messages, stream_options={"include_usage": True})
    last = with_usage[-1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == 5
    assert (
        last["usage"]["completion_tokens"] == len(deltas(with_usage, "content")) - 1
    )  # minus the empty opener
    assert last["usage"]["total_tokens"] == 5 + last["usage"]["completion_tokens"]
    without = await stream(session, messages=messages)
    assert all("usage" not in c for c in without)


async def test_max_tokens_gives_length(session) -> None:
    chunks = await stream(session, messages=[user("a b c d e f g")], max_tokens=3)
    assert "".join(deltas(chunks, "content")) == "You said: a "
    assert finish(chunks) == "length"


async def test_models_and_bad_requests(session) -> None:
    client, base = session
    async with client.get(f"{base}/models") as resp:
        models = await resp.json()
    assert models["object"] == "list" and models["data"][0]["id"] == "scripted"
    async with client.post(f"{base}/chat/completions", data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "invalid_request_error"
    async with client.post(f"{base}/chat/completions", json={"model": "m"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "messages"


def test_a_tool_is_called_by_the_last_word_of_its_name_when_nothing_else_matches() -> None:
    """The compliance suite's "What's the weather like in San Francisco?" calls get_weather;
    a fuller mention wins, and a short last word (`ls` of `dir_ls`) is never enough."""
    from streamer.scripted_model import plan_reply

    def tool(name: str) -> dict[str, object]:
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}

    def called(text: str, *names: str) -> list[str]:
        body = {"messages": [{"role": "user", "content": text}], "tools": [tool(n) for n in names]}
        return [call.name for call in plan_reply(body).calls]

    assert called("What's the weather like in San Francisco?", "get_weather") == ["get_weather"]
    assert called("run forecast_weather", "get_weather", "forecast_weather") == ["forecast_weather"]
    assert called("list the ls output", "dir_ls") == []
    assert called("Say hello.", "get_weather") == []
