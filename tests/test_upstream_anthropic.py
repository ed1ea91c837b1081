"""`--upstream-api anthropic` (issue 29): an Anthropic Messages backend behind the gateway.

The official SDK (HTTP and the WebSocket mode) against the gateway in front of the scripted
Messages backend (tests/scripted_messages_backend.py), which streams exactly the documented
events and refuses what the real API refuses: what llama.cpp cannot produce (signed and
redacted thinking replayed, cache usage, 529, an error mid-stream), the errors mapped, the
`--config` kind, and `tap` / `replay` reading the kind's stream.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import websockets
from aiohttp import web
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import (
    DONE,
    Status,
    error_chunk,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)
from scripted_messages_backend import ScriptedMessagesBackend, anthropic_error, cache, redacted
from sdk_models import validate_event

from streamer.app import PROFILE_PROBE, create_app
from streamer.cli import build_parser
from streamer.config import Settings
from streamer.frontends.frontdoor import GuardedSite
from streamer.turns.recorder import chunk_bytes

TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]
INCLUDE = ["reasoning.encrypted_content"]
KEY = "sk-ant-scripted-key"
END = [finish("stop"), usage(30, 5), DONE]
CALL = [
    *reasoning_chunks(["I should ", "search."]),
    *tool_call_chunks(0, "toolu_01", ["mcp__docs__search"], ['{"q":', '"ns"}']),
    finish("tool_calls"),
    usage(40, 9),
    DONE,
]


def _harness(profile: str = "anthropic", **overrides: Any) -> GatewayHarness:
    backend = ScriptedMessagesBackend()
    return GatewayHarness(
        backend=backend,
        upstream_api="anthropic",
        backend_profile=profile,
        upstream_api_key=KEY,
        **overrides,
    )


def _sdk(gw: GatewayHarness) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0)


async def test_a_text_answer_over_messages_with_the_key_and_the_version() -> None:
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script([*text_chunks(["Hel", "lo"]), *END])
        stream = await client.responses.create(model="claude-x", input="hi", stream=True)
        events = [e async for e in stream]
        for event in events:
            validate_event(event.to_dict())
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "Hello"
        record = gw.backend.records[-1]
        assert record.path == "/v1/messages"
        assert record.headers["x-api-key"] == KEY and "authorization" not in record.headers
        assert record.headers["anthropic-version"] == "2023-06-01"
        sent = gw.backend.requests[-1]
        assert sent["stream"] is True and sent["model"] == "claude-x"
        assert sent["max_tokens"] == 32000  # the anthropic profile's default
        assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        assert gw.backend.rejections == []


async def _turns_over_http(client: AsyncOpenAI, history: list[Any]) -> Any:
    return await client.responses.create(
        model="claude-x",
        input=history,
        tools=TOOLS,  # type: ignore[arg-type]
        include=INCLUDE,  # type: ignore[list-item]
        store=False,
        reasoning={"effort": "low"},
    )


async def _turn_over_ws(ws: Any, history: list[Any]) -> dict[str, Any]:
    create = {"type": "response.create", "model": "claude-x", "input": history, "tools": TOOLS,
              "include": INCLUDE, "store": False, "reasoning": {"effort": "low"}}  # fmt: skip
    await ws.send(orjson.dumps(create).decode())
    while True:
        event = orjson.loads(await ws.recv())
        if event["type"] in ("response.completed", "response.failed", "error"):
            assert event["type"] == "response.completed", event
            return dict(event["response"])


async def test_a_forwarded_client_key_goes_to_the_backend_as_its_x_api_key() -> None:
    """`--forward-authorization`: the client's own bearer token is the Anthropic key, in the
    header that API reads (an `Authorization` header would be ignored there)."""
    async with _harness(forward_authorization=True) as gw:
        async with AsyncOpenAI(base_url=gw.url, api_key="sk-ant-client", max_retries=0) as c:
            gw.backend.script([*text_chunks(["ok"]), *END])
            answer = await c.responses.create(model="claude-x", input="hi")
        assert answer.output_text == "ok"
        record = gw.backend.records[-1]
        assert record.headers["x-api-key"] == "sk-ant-client"
        assert "authorization" not in record.headers


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_signed_thinking_goes_back_before_its_tool_use_on_the_next_turn(
    websocket: bool,
) -> None:
    """Turn 1: thinking, then a call on a namespaced tool (restored). Turn 2 (`store: false`,
    the client's own items): the backend gets the signed thinking block back, as it signed
    it, before the tool_use, and the tool_result after it; it refuses anything else."""
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(CALL, [*text_chunks(["Found it."]), *END])
        history: list[Any] = [{"role": "user", "content": "search the docs"}]
        if websocket:
            async with websockets.connect(gw.ws_url) as ws:
                first = await _turn_over_ws(ws, history)
                output = first["output"]
                result = {"type": "function_call_output", "call_id": output[-1]["call_id"],
                          "output": "3 hits"}  # fmt: skip
                second = await _turn_over_ws(ws, [*history, *output, result])
            text = second["output"][-1]["content"][0]["text"]
        else:
            response = await _turns_over_http(client, history)
            output = [item.to_dict() for item in response.output]
            result = {"type": "function_call_output", "call_id": output[-1]["call_id"],
                      "output": "3 hits"}  # fmt: skip
            text = (await _turns_over_http(client, [*history, *output, result])).output_text
        assert text == "Found it."
        reasoning, call = output
        assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
        assert (call["name"], call["namespace"], call["call_id"]) == (
            "search",
            "mcp__docs",
            "toolu_01",
        )
        assert gw.backend.rejections == []
        first_sent, second_sent = gw.backend.requests
        assert first_sent["thinking"] == {"type": "enabled", "budget_tokens": 4096}
        assert [t["name"] for t in first_sent["tools"]] == ["mcp__docs__search", "exec_command"]
        assistant = second_sent["messages"][1]["content"]
        assert [b["type"] for b in assistant] == ["thinking", "tool_use"]
        assert assistant[0]["thinking"] == "I should search."
        assert assistant[0]["signature"] == gw.backend.sign("I should search.")
        assert assistant[1] == {"type": "tool_use", "id": "toolu_01", "name": "mcp__docs__search",
                                "input": {"q": "ns"}}  # fmt: skip
        answer = second_sent["messages"][2]["content"][0]
        assert answer == {"type": "tool_result", "tool_use_id": "toolu_01", "content": "3 hits"}


async def test_a_forged_signature_is_the_backends_400() -> None:
    """The control: the scripted backend checks signatures as the API does."""
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(CALL)
        response = await _turns_over_http(client, [{"role": "user", "content": "go"}])
        output = [item.to_dict() for item in response.output]
        gw.backend.secret = b"another key"  # what it signed no longer verifies
        result = {"type": "function_call_output", "call_id": "toolu_01", "output": "x"}
        with pytest.raises(openai.BadRequestError) as raised:
            await _turns_over_http(client, [{"role": "user", "content": "go"}, *output, result])
        assert "Invalid `signature`" in raised.value.message
        assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]


async def test_redacted_thinking_goes_back_as_it_came() -> None:
    data = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
    script = [
        redacted(data),
        *tool_call_chunks(0, "toolu_r", ["exec_command"], ['{"cmd":"ls"}']),
        finish("tool_calls"),
        DONE,
    ]
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(script, [*text_chunks(["done"]), *END])
        response = await _turns_over_http(client, [{"role": "user", "content": "go"}])
        output = [item.to_dict() for item in response.output]
        assert [i["type"] for i in output] == ["reasoning", "function_call"]
        assert data not in str(output)  # sealed, never shown
        result = {"type": "function_call_output", "call_id": "toolu_r", "output": "a.txt"}
        again = await _turns_over_http(client, [{"role": "user", "content": "go"}, *output, result])
        assert again.output_text == "done" and gw.backend.rejections == []
        assistant = gw.backend.requests[-1]["messages"][1]["content"]
        assert assistant[0] == {"type": "redacted_thinking", "data": data}


async def test_cache_reads_and_writes_are_the_usage() -> None:
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(
            [cache(1200, 300), *text_chunks(["ok"]), finish("stop"), usage(1510, 4), DONE]
        )
        response = await client.responses.create(
            model="claude-x", input="hi", instructions="x" * 5000, prompt_cache_key="conv-1"
        )
        assert response.usage is not None
        assert response.usage.input_tokens == 10 + 1200 + 300  # uncached, read, written
        assert response.usage.input_tokens_details.cached_tokens == 1200
        assert response.usage.output_tokens == 4
        sent = gw.backend.requests[-1]
        assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}


async def test_overloaded_is_a_503_with_retry_advice() -> None:
    async with _harness() as gw, aiohttp.ClientSession() as http:
        gw.backend.script([anthropic_error(529, "overloaded_error", "Overloaded")])
        body = {"model": "claude-x", "input": "hi"}
        async with http.post(f"{gw.url}/responses", json=body) as answer:
            assert answer.status == 503
            assert answer.headers["retry-after"] == "1"
            error = (await answer.json())["error"]
        assert error["code"] == "server_is_overloaded" and "retry" in error["message"]


async def test_rate_limits_keep_their_retry_after() -> None:
    limited = anthropic_error(
        429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
    )
    limited = Status(
        429, limited.body, {"retry-after": "17", "anthropic-ratelimit-tokens-remaining": "0"}
    )
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script([limited])
        with pytest.raises(openai.RateLimitError) as raised:
            await client.responses.create(model="claude-x", input="hi")
        assert raised.value.response.headers["retry-after"] == "17"
        assert raised.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]


async def test_a_prompt_too_long_is_context_length_exceeded() -> None:
    too_long = anthropic_error(
        400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
    )
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script([too_long])
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(model="claude-x", input="hi")
        assert raised.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        assert "prompt is too long" in raised.value.message


async def test_an_error_event_mid_stream_fails_the_response() -> None:
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(
            [*text_chunks(["par"]), error_chunk("Overloaded", type="overloaded_error")]
        )
        stream = await client.responses.create(model="claude-x", input="hi", stream=True)
        events = [e async for e in stream]
        assert events[-1].type == "response.failed"
        error = events[-1].response.error
        assert error is not None and error.message == "Overloaded"
        assert error.code == "server_error"


async def test_a_whole_json_message_is_decoded_as_its_stream_would_be() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
               "content": [{"type": "text", "text": "whole"},
                           {"type": "tool_use", "id": "toolu_w", "name": "mcp__docs__search",
                            "input": {"q": "x"}}],
               "stop_reason": "tool_use", "stop_sequence": None,
               "usage": {"input_tokens": 3, "output_tokens": 2}}  # fmt: skip
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script([Status(200, message)])
        response = await client.responses.create(model="claude-x", input="hi", tools=TOOLS)  # type: ignore[arg-type]
        message, call = response.output
        assert message.type == "message"
        assert response.output_text == "whole"
        assert (call.name, call.namespace, call.arguments) == ("search", "mcp__docs", '{"q":"x"}')  # type: ignore[union-attr]


async def test_a_model_of_the_config_file_speaks_anthropic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_KEY", KEY)
    config = tmp_path / "streamer.toml"
    async with ScriptedMessagesBackend() as backend:
        config.write_text(
            "[[models]]\n"
            'name = "claude"\n'
            f'upstreams = ["{backend.base_url}"]\n'
            'api = "anthropic"\n'
            'backend_model = "claude-sonnet-4-5"\n'
            'profile = "anthropic"\n'
            'api_key_env = "CLAUDE_KEY"\n'
            "max_output_tokens = 1234\n"
        )
        settings = Settings(config=str(config), profile_probe=False, health_interval=0)
        runner = web.AppRunner(create_app(settings), handler_cancellation=True)
        await runner.setup()
        try:
            site = GuardedSite(runner, "127.0.0.1", 0)
            await site.start()
            client = AsyncOpenAI(
                base_url=f"http://127.0.0.1:{site.port}/v1", api_key="k", max_retries=0
            )
            backend.script([*text_chunks(["from claude"]), *END])
            response = await client.responses.create(model="claude", input="hi")
        finally:
            await runner.cleanup()
    assert response.output_text == "from claude"
    sent = backend.requests[-1]
    assert (sent["model"], sent["max_tokens"]) == ("claude-sonnet-4-5", 1234)
    assert backend.records[-1].headers["x-api-key"] == KEY


async def test_max_tokens_from_the_model_metadata_file(tmp_path: Path) -> None:
    metadata = tmp_path / "models.toml"
    metadata.write_text(
        "[defaults]\nmax_output_tokens = 2048\n[models.claude-big]\nmax_output_tokens = 64000\n"
    )
    async with _harness(model_metadata=str(metadata)) as gw, _sdk(gw) as client:
        gw.backend.script([*text_chunks(["a"]), *END], [*text_chunks(["b"]), *END])
        await client.responses.create(model="claude-big", input="hi")
        await client.responses.create(model="claude-small", input="hi")
        assert [r["max_tokens"] for r in gw.backend.requests] == [64000, 2048]
        catalog = await client.models.list()
        assert catalog.data  # the file's own key is the gateway's: Codex is not told it
        async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/models") as answer:
            assert "max_output_tokens" not in await answer.text()


async def test_tap_reads_the_backends_stream_and_replay_reproduces_the_turn(tmp_path: Path) -> None:
    from streamer.tap.command import run_tap
    from streamer.tap.replay import run_replay

    tap = tmp_path / "tap"
    async with _harness(tap_dir=str(tap)) as gw, _sdk(gw) as client:
        gw.backend.script(CALL)
        await client.responses.create(model="claude-x", input="go", tools=TOOLS, include=INCLUDE)  # type: ignore[arg-type, list-item]
    (path,) = tap.iterdir()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    out = io.StringIO()
    args = build_parser().parse_args(["tap", str(path), "--color", "never"])
    assert await run_tap(args, out) == 0, out.getvalue()  # the client's events: the grammar holds
    args = build_parser().parse_args(["replay", str(path), "--compare", "--color", "never"])
    out = io.StringIO()
    assert await run_replay(args, out) == 0, out.getvalue()  # read back as this kind's stream
    raw = b"".join(chunk_bytes(line) for line in lines if line.get("kind") == "backend_chunk")
    stream = tmp_path / "anthropic.sse"
    stream.write_bytes(raw)
    request = tmp_path / "request.json"
    request.write_text(orjson.dumps({"tools": TOOLS}).decode())
    out = io.StringIO()
    args = build_parser().parse_args(
        ["tap", str(stream), "--tools", str(request), "--color", "never"]
    )
    assert await run_tap(args, out) == 0, out.getvalue()
    shown = out.getvalue()
    assert "anthropic-sse" in shown and "ended tool_calls" in shown
    assert "mcp__docs" in shown and "search" in shown


class ClaudeModels(ScriptedMessagesBackend):
    """`GET /v1/models` as Anthropic answers it: only with the key, in its own list shape."""

    async def _models(self, request: web.Request) -> web.Response:
        if request.headers.get("x-api-key") != KEY or "anthropic-version" not in request.headers:
            return web.json_response(
                anthropic_error(401, "authentication_error", "no").body, status=401
            )
        entry = {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
                 "created_at": "2025-09-29T00:00:00Z"}  # fmt: skip
        return web.json_response({"data": [entry], "has_more": False, "first_id": entry["id"]})


async def test_the_startup_probe_recognises_anthropic(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "streamer.upstream")
    backend = ClaudeModels()
    async with GatewayHarness(
        backend=backend, upstream_api="anthropic", upstream_api_key=KEY, profile_probe=True
    ) as gw:
        assert gw.runner is not None
        fit = await gw.runner.app[PROFILE_PROBE].task
    assert fit is not None and fit.profile == "anthropic"
    (line,) = [r.getMessage() for r in caplog.records if "fits it" in r.getMessage()]
    assert "--backend-profile anthropic" in line and "configured: generic" in line


def test_a_models_max_output_tokens_is_checked_where_it_is_set() -> None:
    from streamer.core.model_catalog import parse_catalog
    from streamer.core.models_config import ConfigError, parse

    text = '[[models]]\nname = "c"\nupstreams = ["http://h/v1"]\napi = "anthropic"\nmax_output_tokens = 0\n'
    with pytest.raises(ConfigError, match=r"f.toml:5: models\[0\].max_output_tokens"):
        parse(text, "f.toml", {}, ("generic",), ("chat", "anthropic"))
    with pytest.raises(
        ValueError, match=r"models\.c\.max_output_tokens: must be a positive integer"
    ):
        parse_catalog({"models": {"c": {"max_output_tokens": "8k"}}})


async def test_a_stored_turn_without_sealed_thinking_goes_on_without_thinking() -> None:
    """`store: true` and no `include`: the reasoning item keeps no signature, so the tool
    loop's next request turns budgeted thinking off, which the API then takes."""
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script(CALL, [*text_chunks(["done"]), *END])
        first = await client.responses.create(
            model="claude-x",
            input="go",
            tools=TOOLS,
            reasoning={"effort": "low"},  # type: ignore[arg-type]
        )
        result = {"type": "function_call_output", "call_id": "toolu_01", "output": "x"}
        second = await client.responses.create(
            model="claude-x", input=[result], previous_response_id=first.id, tools=TOOLS,  # type: ignore[arg-type, list-item]
            reasoning={"effort": "low"},
        )  # fmt: skip
        assert second.output_text == "done" and gw.backend.rejections == []
        first_sent, second_sent = gw.backend.requests
        assert "thinking" in first_sent and "thinking" not in second_sent
        assert [b["type"] for b in second_sent["messages"][1]["content"]] == ["tool_use"]


async def test_compaction_over_a_messages_backend() -> None:
    from streamer.core.compaction import HANDOVER_PROMPT

    history = [
        {"type": "message", "role": "user", "content": "Fix the parser"},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    async with _harness() as gw, _sdk(gw) as client:
        gw.backend.script([*text_chunks(["Goal: ship the parser."]), *END])
        compacted = await client.responses.compact(model="claude-x", input=history)  # type: ignore[arg-type]
        assert compacted.output[-1].type == "compaction"
        (sent,) = gw.backend.requests
        assert gw.backend.rejections == []
        # no tools declared, but the history calls one: declared for it, none callable
        assert sent["tool_choice"] == {"type": "none"}
        assert sent["tools"] == [{"name": "exec_command", "input_schema": {"type": "object"}}]
        last = sent["messages"][-1]["content"]
        assert last[0]["type"] == "tool_result" and last[-1]["text"] == HANDOVER_PROMPT
