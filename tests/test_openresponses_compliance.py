"""The Open Responses compliance suite, as Python tests, against the gateway on its
embedded scripted model (what `make run` serves).

The project's own suite (openresponses/openresponses, `bin/compliance-test.ts` over
`src/lib/compliance-tests.ts`) is TypeScript run with bun over zod schemas that kubb
generates from the spec; it is not published as a package. These tests are its Python
equivalent, run with the rest of the suite: the same requests and the same checks: each Response must validate against the spec's `ResponseResource`, each streamed
event against its event schema, then the test's own checks (output present, `completed`,
a `function_call` where one is expected, the function call events). The WebSocket tests
follow the spec's `x-openresponses-websocket`: sequential responses on one socket, a
`store: false` continuation by `previous_response_id`, and `previous_response_not_found`
after a reconnect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
import websockets
from aiohttp import web
from conformance import check_event, check_response, check_ws_error

from streamer.app import create_app
from streamer.config import Settings
from streamer.frontends.frontdoor import GuardedSite

MODEL = "gpt-4o-mini"  # the suite's default model name; the embedded model answers any
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": "The city and state, e.g. San Francisco, CA",
            }
        },
        "required": ["location"],
    },
}
# a 32x32 PNG, as the suite sends (its bytes do not matter to a text model)
IMAGE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAFklEQVR42mP8z8Dw"
    "n4EIwDiqkL4KAcT9GO0U4BxoAAAAAElFTkSuQmCC"
)
PDF = "data:application/pdf;base64,JVBERi0xLjEKJSVFT0Y="


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    """The gateway with no --upstream: the embedded scripted model, as `make run`."""
    runner = web.AppRunner(create_app(Settings()), handler_cancellation=True)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site.port}/v1"
    finally:
        await runner.cleanup()


def _sse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith("data:")]
        if data:
            events.append(orjson.loads("\n".join(data)))
    return events


async def _create(
    base: str, body: dict[str, Any], stream: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """POST /responses as the suite does: the final Response, the events, the violations."""
    headers = {"Authorization": "Bearer test-key"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/responses", json={**body, "stream": stream}, headers=headers) as r,
    ):
        text = await r.text()
        assert r.status == 200, f"HTTP {r.status}: {text}"
    if not stream:
        response = orjson.loads(text)
        return response, [], check_response(response)
    events = _sse_events(text)
    errors = [e for event in events for e in check_event(event, "sse")]
    terminal = [
        e
        for e in events
        if e["type"] in ("response.completed", "response.failed", "response.incomplete")
    ]
    assert terminal, "no terminal event"
    response = terminal[-1]["response"]
    return response, events, errors + check_response(response)


def _has_output(r: dict[str, Any]) -> list[str]:
    return [] if r.get("output") else ["Response has no output items"]


def _completed(r: dict[str, Any]) -> list[str]:
    status = r.get("status")
    return [] if status == "completed" else [f'Expected status "completed" but got "{status}"']


def _has_type(kind: str) -> Callable[[dict[str, Any]], list[str]]:
    def check(r: dict[str, Any]) -> list[str]:
        found = any(item.get("type") == kind for item in r.get("output") or [])
        return [] if found else [f'Expected output item of type "{kind}" but none found']

    return check


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


SINGLE: dict[str, tuple[dict[str, Any], bool, list[Callable[[dict[str, Any]], list[str]]]]] = {
    "basic-response": (
        {"input": [_user("Say hello in exactly 3 words.")]},
        False,
        [_has_output, _completed],
    ),
    "streaming-response": ({"input": [_user("Count from 1 to 5.")]}, True, [_completed]),
    "system-prompt": (
        {
            "input": [
                {
                    "type": "message",
                    "role": "system",
                    "content": "You are a pirate. Always respond in pirate speak.",
                },
                _user("Say hello."),
            ]
        },
        False,
        [_has_output, _completed],
    ),
    "tool-calling": (
        {"input": [_user("What's the weather like in San Francisco?")], "tools": [WEATHER_TOOL]},
        False,
        [_has_output, _has_type("function_call")],
    ),
    "tool-calling-streaming": (
        {"input": [_user("What's the weather like in San Francisco?")], "tools": [WEATHER_TOOL]},
        True,
        [_has_output, _has_type("function_call")],
    ),
    "image-input": (
        {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "What do you see in this image? Answer in one sentence.",
                        },
                        {"type": "input_image", "image_url": IMAGE},
                    ],
                }
            ]
        },
        False,
        [_has_output, _completed],
    ),
    "file-input": (
        {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "Read the attached file and answer with its title only.",
                        },
                        {
                            "type": "input_file",
                            "filename": "openresponses-fixture.pdf",
                            "file_data": PDF,
                        },
                    ],
                }
            ]
        },
        False,
        [_has_output, _completed],
    ),
    "multi-turn": (
        {
            "input": [
                _user("My name is Alice."),
                {
                    "type": "message",
                    "role": "assistant",
                    "content": "Hello Alice! Nice to meet you. How can I help you today?",
                },
                _user("What is my name?"),
            ]
        },
        False,
        [_has_output, _completed],
    ),
}


@pytest.mark.parametrize("test_id", list(SINGLE))
async def test_single_request(base_url: str, test_id: str) -> None:
    body, stream, checks = SINGLE[test_id]
    response, events, errors = await _create(base_url, {"model": MODEL, **body}, stream)
    errors += [e for check in checks for e in check(response)]
    if stream:
        errors += [] if events else ["No streaming events received"]
    if test_id == "tool-calling-streaming":
        kinds = [e["type"] for e in events]
        calls = [
            e for e in events if e["type"].startswith("response.output_item.")
            and e["item"]["type"] == "function_call"
        ]  # fmt: skip
        for needed in (
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
        ):
            errors += [] if needed in kinds else [f"Missing {needed} event"]
        errors += [] if len(calls) == 2 else ["Missing output_item.added/done with function_call"]
    assert errors == []


async def test_function_call_round_trip(base_url: str) -> None:
    first, _, errors = await _create(
        base_url,
        {
            "model": MODEL,
            "input": "Use the weather tool to get the temperature in San Francisco.",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
        },
    )
    call = next(item for item in first["output"] if item["type"] == "function_call")
    second, _, more = await _create(
        base_url,
        {
            "model": MODEL,
            "previous_response_id": first["id"],
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": "64 degrees and clear",
                }
            ],
        },
    )
    assert errors + more + _has_output(second) + _completed(second) == []
    assert "64 degrees and clear" in second["output"][-1]["content"][0]["text"]


async def test_previous_response_id(base_url: str) -> None:
    first, _, errors = await _create(
        base_url,
        {"model": MODEL, "input": "Remember this code word: papaya. Reply with only OK."},
    )
    second, _, more = await _create(
        base_url,
        {
            "model": MODEL,
            "previous_response_id": first["id"],
            "input": "What code word did I ask you to remember?",
        },
    )
    assert errors + more + _has_output(second) + _completed(second) == []
    assert second["previous_response_id"] == first["id"]


# -- the WebSocket mode (x-openresponses-websocket) --------------------------------------


async def _ws_turn(ws: Any, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """One response.create; the events up to the terminal one (or an error event)."""
    await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
    events: list[dict[str, Any]] = []
    errors: list[str] = []
    while True:
        event = orjson.loads(await ws.recv())
        events.append(event)
        if event["type"] == "error":
            return events, errors + check_ws_error(event)
        errors += check_event(event, "websocket")
        if event["type"] in ("response.completed", "response.failed", "response.incomplete"):
            return events, errors + check_response(event["response"])


def _ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/responses"


async def test_websocket_sequential_responses(base_url: str) -> None:
    async with websockets.connect(_ws_url(base_url)) as ws:
        first, errors = await _ws_turn(ws, {"model": MODEL, "input": "Say hello."})
        second, more = await _ws_turn(ws, {"model": MODEL, "input": "Count from 1 to 5."})
    assert errors + more == []
    for events in (first, second):
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert first[-1]["response"]["id"] != second[-1]["response"]["id"]


async def test_websocket_store_false_continuation(base_url: str) -> None:
    async with websockets.connect(_ws_url(base_url)) as ws:
        first, errors = await _ws_turn(
            ws,
            {
                "model": MODEL,
                "store": False,
                "input": "Call get_weather for Paris.",
                "tools": [WEATHER_TOOL],
            },
        )
        done = first[-1]["response"]
        call = next(item for item in done["output"] if item["type"] == "function_call")
        second, more = await _ws_turn(
            ws,
            {
                "model": MODEL,
                "store": False,
                "previous_response_id": done["id"],
                "input": [
                    {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
                ],
                "tools": [WEATHER_TOOL],
            },
        )
    assert errors + more == []
    answer = second[-1]["response"]
    assert answer["status"] == "completed" and answer["previous_response_id"] == done["id"]
    assert "sunny" in answer["output"][-1]["content"][0]["text"]


async def test_websocket_previous_response_not_found_after_reconnect(base_url: str) -> None:
    async with websockets.connect(_ws_url(base_url)) as ws:
        first, errors = await _ws_turn(ws, {"model": MODEL, "store": False, "input": "Say hello."})
    response_id = first[-1]["response"]["id"]
    async with websockets.connect(_ws_url(base_url)) as ws:  # a new connection: nothing kept
        events, more = await _ws_turn(
            ws,
            {
                "model": MODEL,
                "store": False,
                "previous_response_id": response_id,
                "input": "Again.",
            },
        )
    assert errors + more == []
    (error,) = events
    assert (error["type"], error["status"]) == ("error", 400)
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
