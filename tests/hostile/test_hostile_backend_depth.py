"""Issue 25, row 12: a backend sends JSON nested deeper than the gateway can serialise.

A `/v1/responses` backend's foreign output item 300 levels deep was parsed (orjson reads
1,024) and then failed where the gateway serialised it into its own events: the turn ended
`server_error`, with a traceback in the log. The same for a vendor event type the gateway
passes on, and for a Chat backend that sends a call's arguments as an object (Ollama).
Now an item or event nested deeper than a client could send back (`MAX_ITEM_DEPTH`) fails
the turn cleanly (`invalid_upstream_chunk` in the error's `type`, the reason in its
message, no traceback), and
one exactly that deep passes through and can be sent back in the next request's `input`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from builders import client_session, parse_sse
from harness import GatewayHarness
from scripted_backend import DONE, ScriptedBackend, finish, text_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend

from streamer.core.json_bounds import MAX_ITEM_DEPTH

INVALID_CHUNK = "invalid_upstream_chunk"


def nested(depth: int) -> bytes:
    """JSON of `depth` objects nested in one another; 0: a number."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def foreign_item(depth: int) -> bytes:
    """An item of a type the gateway does not know, nested `depth` deep in all."""
    return (
        b'{"type":"vendor_thing","id":"vt_1","status":"completed","data":'
        + nested(depth - 1)
        + b"}"
    )


def frame(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def item_done(item: bytes) -> bytes:
    head = b'{"type":"response.output_item.done","output_index":0,"sequence_number":1,"item":'
    return frame("response.output_item.done", head + item + b"}")


def vendor_event(depth: int) -> bytes:
    head = b'{"type":"response.vendor.note","sequence_number":1,"note":'
    return frame("response.vendor.note", head + nested(depth - 1) + b"}")


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fails the test if the gateway logged an error (a bug logs its traceback)."""
    with caplog.at_level(logging.ERROR):
        yield
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def create(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with client_session() as session, session.post(url + "/responses", json=body) as r:
        data = await r.read()
        return r.status, parse_sse(data) if body.get("stream") else orjson.loads(data)


def responses_gateway() -> GatewayHarness:
    backend = ScriptedResponsesBackend(personality="openai")
    return GatewayHarness(backend=backend, upstream_api="responses", backend_profile="openai")


def assert_failed_cleanly(status: int, answer: Any, stream: bool) -> None:
    response = answer[-1]["response"] if stream else answer
    assert status == 200, answer
    assert response["status"] == "failed", response
    error = response["error"]  # a code clients do not know is in `type` (core/output.py)
    assert error.get("type") == INVALID_CHUNK, error
    assert "nested" in error["message"] and str(MAX_ITEM_DEPTH) in error["message"], error


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("depth", [MAX_ITEM_DEPTH + 1, 300, 1000])
async def test_a_too_deep_foreign_item_fails_the_turn_cleanly(
    depth: int, stream: bool, no_errors_logged: None
) -> None:
    async with responses_gateway() as gw:
        gw.backend.script([item_done(foreign_item(depth)), *text_chunks(["hi"]), finish(), DONE])
        status, answer = await create(gw.url, {"model": "m", "input": "go", "stream": stream})
        assert_failed_cleanly(status, answer, stream)


@pytest.mark.parametrize("depth", [MAX_ITEM_DEPTH + 1, 300, 1000])
async def test_a_too_deep_vendor_event_fails_the_turn_cleanly(
    depth: int, no_errors_logged: None
) -> None:
    async with responses_gateway() as gw:
        gw.backend.script([vendor_event(depth), *text_chunks(["hi"]), finish(), DONE])
        status, answer = await create(gw.url, {"model": "m", "input": "go", "stream": True})
        assert_failed_cleanly(status, answer, True)


@pytest.mark.emits_invalid  # an item type the spec does not know, passed on as promised
async def test_a_foreign_item_exactly_max_item_depth_passes_and_goes_back(
    no_errors_logged: None,
) -> None:
    async with responses_gateway() as gw:
        gw.backend.script(
            [item_done(foreign_item(MAX_ITEM_DEPTH)), *text_chunks(["hi"]), finish(), DONE]
        )
        status, answer = await create(gw.url, {"model": "m", "input": "go", "store": False})
        assert status == 200 and answer["status"] == "completed", answer
        kinds = [item["type"] for item in answer["output"]]
        assert kinds == ["vendor_thing", "message"], kinds
        gw.backend.script([*text_chunks(["again"]), finish(), DONE])
        history = [{"role": "user", "content": "go"}, *answer["output"]]
        status, again = await create(gw.url, {"model": "m", "input": history, "store": False})
        assert status == 200 and again["status"] == "completed", again


def ollama_call(arguments: bytes) -> bytes:
    """A Chat chunk whose call's arguments are an object, as Ollama sends them."""
    head = b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
    return b"data: " + head + b'"function":{"name":"f","arguments":' + arguments + b"}}]}}]}\n\n"


@pytest.mark.parametrize("depth", [255, 300, 1000])
async def test_a_too_deep_arguments_object_from_a_chat_backend_fails_the_turn_cleanly(
    depth: int, no_errors_logged: None
) -> None:
    async with GatewayHarness(backend=ScriptedBackend()) as gw:
        gw.backend.script([ollama_call(nested(depth)), finish("tool_calls"), usage(3, 2), DONE])
        tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        status, answer = await create(gw.url, {"model": "m", "input": "go", "tools": tools})
        assert_failed_cleanly(status, answer, False)
