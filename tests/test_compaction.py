"""Remote compaction and sealed `encrypted_content` (issue 16, parts 1 and 2).

The official SDK (`responses.compact()`, `responses.create()` with the trigger, streamed
and not, the WebSocket mode) against the gateway in front of a scripted backend; the
backend's requests show what the model is shown on replay.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets
from harness import GatewayHarness
from openai import AsyncOpenAI, BadRequestError, InternalServerError
from openai.types.responses import CompactedResponse
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
from sdk_models import validate_event, validate_response

from streamer.cli import build_parser
from streamer.core.compaction import HANDOVER_PROMPT, LAST_REQUEST_HEADING, SUMMARY_HEADING
from streamer.core.sealing import MAX_SEALED_CHARS, PREFIX, Sealer
from streamer.tap.replay import run_replay

SUMMARY = "Goal: ship the parser. Files touched: src/parse.py."
TRIGGER = {"type": "compaction_trigger"}
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": "You are a coding agent."},
    {"type": "message", "role": "user", "content": "Fix the parser in src/parse.py"},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"type": "message", "role": "assistant", "content": "Done with step one."},
]
TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]


def _summary_script(text: str = SUMMARY) -> list[Any]:
    half = len(text) // 2
    return [
        *reasoning_chunks(["let me think"]),
        *text_chunks([text[:half], text[half:]]),
        finish("stop"),
        usage(120, 30),
        DONE,
    ]


def _client(gw: GatewayHarness) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key="unused", max_retries=0)


def _seen(body: dict[str, Any]) -> str:
    """Everything the backend was shown, as one text."""
    return "\n".join(str(m.get("content")) for m in body["messages"])


def _as_input(compacted: CompactedResponse) -> list[dict[str, Any]]:
    """The compacted output as the next request's input (the SDK types its user messages as
    output messages, as for OpenAI's own answer: its serializer warnings are not ours)."""
    return [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]


async def _compact(gw: GatewayHarness) -> CompactedResponse:
    gw.backend.script(_summary_script())
    async with _client(gw) as client:
        return await client.responses.compact(model="m", input=HISTORY)  # type: ignore[arg-type]


async def test_sdk_compact_returns_a_compacted_resource() -> None:
    async with GatewayHarness() as gw:
        compacted = await _compact(gw)
    assert compacted.object == "response.compaction" and compacted.id
    *users, item = compacted.output
    assert [(u.type, u.role) for u in users] == [("message", "user")]  # type: ignore[union-attr]
    assert item.type == "compaction" and item.id.startswith("cmp_")
    assert item.encrypted_content.startswith(PREFIX)  # type: ignore[union-attr]
    assert SUMMARY not in item.encrypted_content  # type: ignore[union-attr]
    assert (compacted.usage.input_tokens, compacted.usage.output_tokens) == (120, 30)
    (sent,) = gw.backend.requests
    assert sent["messages"][-1] == {"role": "user", "content": HANDOVER_PROMPT}
    assert "tools" not in sent and "Fix the parser" in _seen(sent)


async def test_replayed_compaction_reaches_the_backend_as_its_summary() -> None:
    async with GatewayHarness() as gw:
        compacted = await _compact(gw)
        replay = _as_input(compacted)
        replay.append({"type": "message", "role": "user", "content": "Now add tests."})
        async with _client(gw) as client:
            answer = await client.responses.create(model="m", input=replay)  # type: ignore[arg-type]
        assert answer.status == "completed"
        sent = gw.backend.requests[-1]
    summary = next(m for m in sent["messages"] if SUMMARY_HEADING in str(m["content"]))
    assert summary["role"] == "user"
    assert SUMMARY in summary["content"]
    # the last user request, verbatim, whatever the model wrote
    assert f"{LAST_REQUEST_HEADING}\nFix the parser in src/parse.py" in summary["content"]
    assert sent["messages"][-1] == {"role": "user", "content": "Now add tests."}


@pytest.mark.parametrize("stream", [True, False])
async def test_trigger_makes_exactly_one_compaction_item(stream: bool) -> None:
    async with GatewayHarness() as gw:
        gw.backend.script(_summary_script())
        body = {"model": "m", "input": [*HISTORY, TRIGGER], "tools": TOOLS, "store": False}
        async with _client(gw) as client:
            if stream:
                events = []
                async with await client.responses.create(**body, stream=True) as s:  # type: ignore[call-overload]
                    async for event in s:
                        validate_event(event.model_dump(exclude_unset=True))
                        events.append(event)
                done = [e for e in events if e.type == "response.output_item.done"]
                assert len(done) == 1 and done[0].item.type == "compaction"
                assert events[-1].type == "response.completed"
                response = events[-1].response.model_dump(exclude_none=True)
            else:
                response = (await client.responses.create(**body)).model_dump(exclude_none=True)  # type: ignore[call-overload]
        (sent,) = gw.backend.requests
    validate_response(response)
    assert [i["type"] for i in response["output"]] == ["compaction"]
    assert response["usage"]["output_tokens"] == 30
    assert "tools" not in sent and sent["messages"][-1]["content"] == HANDOVER_PROMPT


async def test_continuation_of_a_compaction_leaves_out_what_it_replaced() -> None:
    """`previous_response_id` from a compaction: the history before the trigger is what
    the summary replaced; the backend sees the summary (and the developer message)."""
    async with GatewayHarness() as gw:
        gw.backend.script(_summary_script())
        async with _client(gw) as client:
            first = await client.responses.create(model="m", input=[*HISTORY, TRIGGER])  # type: ignore[arg-type]
            await client.responses.create(model="m", previous_response_id=first.id, input="Go on.")
        sent = gw.backend.requests[-1]
    seen = _seen(sent)
    assert SUMMARY in seen and "You are a coding agent." in seen
    assert "Done with step one." not in seen and not any(
        m.get("tool_calls") for m in sent["messages"]
    )


def _tampered(blob: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(blob[len(PREFIX) :] + "=="))
    raw[20] ^= 1
    return PREFIX + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(_tampered, id="tampered"),
        pytest.param(lambda b: Sealer.random().seal("compaction", "summary", "x"), id="foreign"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:12], id="truncated-short"),
        pytest.param(lambda b: "gAAAAABnot-ours", id="not-ours"),
        pytest.param(lambda b: Sealer.random().seal("reasoning", "text", "x"), id="reasoning-blob"),
        pytest.param(lambda b: PREFIX + "A" * MAX_SEALED_CHARS, id="too-long"),
    ],
)
async def test_a_blob_that_does_not_open_is_a_400_naming_the_item(spoil: Any) -> None:
    async with GatewayHarness() as gw:
        compacted = await _compact(gw)
        blob = compacted.output[-1].encrypted_content  # type: ignore[union-attr]
        items = [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "compaction", "encrypted_content": spoil(blob)},
            {"type": "message", "role": "user", "content": "go on"},
        ]
        async with _client(gw) as client:
            with pytest.raises(BadRequestError) as caught:
                await client.responses.create(model="m", input=items)  # type: ignore[arg-type]
        assert len(gw.backend.requests) == 1  # only the compaction reached the backend
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "input[1].encrypted_content"
    assert error["code"] == "invalid_encrypted_content" and error["type"] == "invalid_request_error"


async def test_the_state_key_file_is_shared_by_instances(tmp_path: Path) -> None:
    """A blob sealed by one instance opens on another with the same key file (a restart
    is the same case); without the file each process has its own key."""
    key = tmp_path / "state.key"
    key.write_bytes(base64.b64encode(b"k" * 32))
    async with GatewayHarness(state_key_file=str(key)) as first:
        compacted = await _compact(first)
    replay = _as_input(compacted)
    async with GatewayHarness(state_key_file=str(key)) as second:
        async with _client(second) as client:
            await client.responses.create(model="m", input=replay)  # type: ignore[arg-type]
        assert SUMMARY in _seen(second.backend.requests[-1])
    async with GatewayHarness() as other, _client(other) as client:
        with pytest.raises(BadRequestError) as caught:
            await client.responses.create(model="m", input=replay)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "input[1].encrypted_content"  # type: ignore[index]


async def test_a_short_state_key_file_stops_the_gateway(tmp_path: Path) -> None:
    key = tmp_path / "short.key"
    key.write_text("too short")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        async with GatewayHarness(state_key_file=str(key)):
            pass


# -- reasoning that only lives in encrypted_content ------------------------------------------


def _reasoning_call(n: int) -> list[Any]:
    return [
        *reasoning_chunks([f"thought {n}: ", f"run step {n}"]),
        *tool_call_chunks(0, f"call_{n}", ["exec_command"], [f'{{"cmd":"step {n}"}}']),
        finish("tool_calls"),
        usage(10, 5),
        DONE,
    ]


async def test_sealed_reasoning_round_trips_to_a_deepseek_style_backend() -> None:
    """store false + include reasoning.encrypted_content, the raw content dropped by the
    client: every earlier tool-call turn still reaches the backend with its
    reasoning_content."""
    async with GatewayHarness(backend_profile="deepseek") as gw:
        gw.backend.script(_reasoning_call(1), _reasoning_call(2), _reasoning_call(3))
        history: list[dict[str, Any]] = [{"role": "user", "content": "Do three steps."}]
        async with _client(gw) as client:
            for _ in range(3):
                answer = await client.responses.create(
                    model="m",
                    input=history,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    store=False,
                    include=["reasoning.encrypted_content"],
                )
                for item in answer.output:
                    kept = item.model_dump(exclude_none=True)
                    if kept["type"] == "reasoning":
                        assert kept["encrypted_content"].startswith(PREFIX)
                        assert "run step" not in kept["encrypted_content"]
                        kept.pop("content")  # the client keeps only the sealed form
                    history.append(kept)
                    if kept["type"] == "function_call":
                        history.append(
                            {
                                "type": "function_call_output",
                                "call_id": kept["call_id"],
                                "output": "ok",
                            }
                        )
        last = gw.backend.requests[-1]
    turns = [m for m in last["messages"] if m.get("tool_calls")]
    assert [m["reasoning_content"] for m in turns] == [
        "thought 1: run step 1",
        "thought 2: run step 2",
    ]


async def test_reasoning_has_no_encrypted_content_unless_asked() -> None:
    async with GatewayHarness() as gw:
        gw.backend.script(_reasoning_call(1))
        async with _client(gw) as client:
            answer = await client.responses.create(model="m", input="x", tools=TOOLS)  # type: ignore[arg-type]
    assert answer.output[0].type == "reasoning"
    assert answer.output[0].encrypted_content is None  # type: ignore[union-attr]


async def test_a_tampered_reasoning_blob_is_a_400() -> None:
    sealed = Sealer.random().seal("reasoning", "text", "secret thoughts")
    items = [
        {"role": "user", "content": "x"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed},
        {"type": "message", "role": "assistant", "content": "ok"},
    ]
    async with GatewayHarness() as gw:
        async with _client(gw) as client:
            with pytest.raises(BadRequestError) as caught:
                await client.responses.create(model="m", input=items)  # type: ignore[arg-type]
        assert gw.backend.requests == []
    assert caught.value.body["param"] == "input[1].encrypted_content"  # type: ignore[index]


# -- the WebSocket mode ------------------------------------------------------------------------


async def _ws_turn(ws: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
    events = []
    while True:
        event = orjson.loads(await ws.recv())
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


async def test_compaction_over_websocket() -> None:
    async with GatewayHarness() as gw:
        gw.backend.script(_summary_script())
        async with websockets.connect(gw.ws_url, open_timeout=5) as ws:
            events = await _ws_turn(ws, {"model": "m", "input": [*HISTORY, TRIGGER]})
            for event in events:
                validate_event(event)
            done = [e for e in events if e["type"] == "response.output_item.done"]
            assert [e["item"]["type"] for e in done] == ["compaction"]
            assert events[-1]["type"] == "response.completed"
            replay = [
                {"type": "message", "role": "user", "content": "Fix the parser in src/parse.py"},
                done[0]["item"],
                {"type": "message", "role": "user", "content": "Continue."},
            ]
            events = await _ws_turn(ws, {"model": "m", "input": replay})
            assert events[-1]["type"] == "response.completed"
        assert SUMMARY in _seen(gw.backend.requests[-1])


# -- bounds and failures ---------------------------------------------------------------------


async def test_a_summary_past_the_output_limit_makes_no_item() -> None:
    """The summary is held whole until it is sealed: `--max-output-bytes` bounds it; past
    it the turn ends incomplete with no compaction item, and `/compact` is a 502."""
    async with GatewayHarness(max_output_bytes=64) as gw:
        gw.backend.script(_summary_script("x" * 100), _summary_script("x" * 100))
        async with _client(gw) as client:
            response = await client.responses.create(model="m", input=[*HISTORY, TRIGGER])  # type: ignore[arg-type]
            with pytest.raises(InternalServerError) as caught:
                await client.responses.compact(model="m", input=HISTORY)  # type: ignore[arg-type]
    assert response.status == "incomplete" and response.output == []
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "compaction_incomplete"  # type: ignore[index]


async def test_a_backend_refusal_of_the_compaction_keeps_its_status() -> None:
    refusal = {"error": {"message": "maximum context length is 10 tokens", "type": "x"}}
    async with GatewayHarness() as gw:
        gw.backend.script([Status(400, refusal)])
        async with _client(gw) as client:
            with pytest.raises(BadRequestError) as caught:
                await client.responses.compact(model="m", input=HISTORY)  # type: ignore[arg-type]
    assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]


async def test_a_failed_compaction_stream_ends_failed_without_an_item() -> None:
    async with GatewayHarness() as gw:
        gw.backend.script([*text_chunks(["half a sum"]), error_chunk("boom"), DONE])
        async with _client(gw) as client:
            response = await client.responses.create(model="m", input=[*HISTORY, TRIGGER])  # type: ignore[arg-type]
    assert response.status == "failed" and response.output == []


async def test_compact_input_is_validated_with_its_param() -> None:
    async with GatewayHarness() as gw:
        async with _client(gw) as client:
            with pytest.raises(BadRequestError) as caught:
                await client.responses.compact(model="m", input=[{"type": "message", "role": "x"}])  # type: ignore[arg-type, list-item]
        assert gw.backend.requests == []
    assert caught.value.body["param"] == "input[0].role"  # type: ignore[index]


async def test_a_compaction_without_backend_usage_is_estimated_not_zero() -> None:
    async with GatewayHarness() as gw:
        gw.backend.script([*text_chunks(["s" * 400]), finish("stop"), DONE])
        async with _client(gw) as client:
            response = await client.responses.create(model="m", input=[*HISTORY, TRIGGER])  # type: ignore[arg-type]
    assert response.usage is not None
    assert response.usage.output_tokens >= 100 and response.usage.input_tokens > 0


async def test_recorded_compactions_replay_the_same(tmp_path: Path) -> None:
    """`streamer replay --compare` of a compaction turn and of the turn replaying its item
    (opened with the recording gateway's `--state-key-file`)."""
    key, tap_dir = tmp_path / "state.key", tmp_path / "tap"
    key.write_bytes(b"r" * 40)
    async with GatewayHarness(state_key_file=str(key), tap_dir=str(tap_dir)) as gw:
        compacted = await _compact(gw)
        replay = _as_input(compacted)
        gw.backend.script([*text_chunks(["ok"]), finish("stop"), usage(3, 1), DONE])
        async with _client(gw) as client:
            await client.responses.create(model="m", input=replay, stream=True)  # type: ignore[arg-type]
    recordings = sorted(tap_dir.iterdir())
    assert len(recordings) == 2
    for path in recordings:
        argv = ["replay", str(path), "--compare", "--state-key-file", str(key)]
        assert await run_replay(build_parser().parse_args(argv), io.StringIO()) == 0, path
