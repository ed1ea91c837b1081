"""Conformance: the penalties, the tool and text echo, and the validator itself.

Every test of the suite already has what the gateway emitted checked against the Open
Responses spec and the OpenAI SDK (tests/conftest.py, `_conformance`); these tests pin the
fields that made every Response fail the spec, and show that the checker does catch a
violation (so the suite-wide check is not vacuous). `test_recorded_scenarios_conform`
replays every recorded backend stream in tests/fixtures through today's pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from conformance import DEVIATIONS, Collector, check_event, check_response, check_ws_error
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, finish, text_chunks, usage

from streamer.core.echo import echo_text, echo_tools
from streamer.core.response import new_response
from streamer.tap.replay import Recording, replay
from streamer.turns.turn import TurnOptions, prepare

FIXTURES = Path(__file__).parent / "fixtures" / "streams"
CONFORMANCE_PAGE = Path(__file__).parent.parent / "docs" / "conformance.md"


def _text_reply(gw: GatewayHarness) -> None:
    gw.backend.script([*text_chunks(["Hel", "lo"]), finish("stop"), usage(5, 2), DONE])


# -- penalties ----------------------------------------------------------------------------


async def test_penalties_are_forwarded_and_echoed(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    _text_reply(gw)
    response = await client.responses.create(
        model="m", input="hi", extra_body={"presence_penalty": 0.5, "frequency_penalty": -1.25}
    )
    sent = gw.backend.requests[-1]
    assert (sent["presence_penalty"], sent["frequency_penalty"]) == (0.5, -1.25)
    assert (response.presence_penalty, response.frequency_penalty) == (0.5, -1.25)


async def test_penalties_default_to_zero_and_are_not_sent(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    _text_reply(gw)
    response = await client.responses.create(model="m", input="hi")
    assert "presence_penalty" not in gw.backend.requests[-1]
    assert "frequency_penalty" not in gw.backend.requests[-1]
    assert (response.presence_penalty, response.frequency_penalty) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("presence_penalty", 2.5, "decimal_above_max_value"),
        ("presence_penalty", -3, "decimal_below_min_value"),
        ("frequency_penalty", 9, "decimal_above_max_value"),
        ("frequency_penalty", "high", "invalid_type"),
        ("frequency_penalty", True, "invalid_type"),
    ],
)
async def test_penalties_out_of_range_are_a_400_with_param(
    gw: GatewayHarness, client: AsyncOpenAI, field: str, value: Any, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="m", input="hi", extra_body={field: value})
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"], error["type"]) == (field, code, "invalid_request_error")
    assert gw.backend.requests == []


# -- the tool and text echo -------------------------------------------------------------


def test_function_tools_echo_with_every_field() -> None:
    tools = echo_tools(
        [
            {"type": "function", "name": "a"},
            {"type": "function", "name": "b", "strict": False, "description": "B."},
            {"type": "function", "name": "c", "strict": None, "parameters": {"type": "object"}},
            {"type": "function", "name": "d", "defer_loading": True},  # unknown fields stay
        ]
    )
    assert tools == [
        {"type": "function", "name": "a", "description": None, "parameters": None, "strict": True},
        {"type": "function", "name": "b", "description": "B.", "parameters": None, "strict": False},
        {
            "type": "function",
            "name": "c",
            "description": None,
            "parameters": {"type": "object"},
            "strict": True,
        },
        {
            "type": "function",
            "name": "d",
            "defer_loading": True,
            "description": None,
            "parameters": None,
            "strict": True,
        },
    ]


def test_extension_tools_echo_as_the_extensions_they_are() -> None:
    custom = {"type": "custom", "name": "patch", "format": {"type": "text"}}
    search = {"type": "tool_search", "execution": "client", "parameters": {"type": "object"}}
    hosted = {"type": "web_search"}
    namespace = {
        "type": "namespace",
        "name": "mcp__x",
        "tools": [{"type": "function", "name": "f"}, custom],
    }
    echoed = echo_tools([namespace, custom, search, hosted])
    assert echoed[1:] == [custom, search, hosted]
    odd = {**namespace, "description": 7}  # ignored by the gateway: echoed as none
    assert echo_tools([odd])[0]["description"] == ""
    assert echoed[0] == {
        "type": "namespace",
        "name": "mcp__x",
        "description": "",  # OpenAI requires it: one sent without is echoed empty
        "tools": [
            {
                "type": "function",
                "name": "f",
                "description": None,
                "parameters": None,
                "strict": True,
            },
            custom,
        ],
    }


def test_json_schema_format_echoes_description_and_strict() -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}
    assert echo_text({"format": fmt}) == {
        "format": {**fmt, "description": None, "strict": False},
        "verbosity": "medium",
    }
    kept = {**fmt, "description": "The answer.", "strict": True}
    assert echo_text({"format": kept, "verbosity": "low"})["format"] == kept
    assert echo_text(None) == {"format": {"type": "text"}, "verbosity": "medium"}


async def test_the_echo_reaches_the_client_and_the_backend_gets_the_tools_as_sent(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    _text_reply(gw)
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}
    response = await client.responses.create(
        model="m",
        input="hi",
        tools=[{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],  # type: ignore[list-item,typeddict-item]
        text={"format": fmt},  # type: ignore[typeddict-item]
    )
    body = response.model_dump()
    (tool,) = body["tools"]
    assert (tool["strict"], tool["description"]) == (True, None)
    assert body["text"]["format"]["description"] is None
    assert "strict" not in gw.backend.requests[-1]["tools"][0]["function"]  # as the client sent


# -- the validator -----------------------------------------------------------------------


def _response(**fields: Any) -> dict[str, Any]:
    request = {"model": "m", "input": "hi", **fields}
    return prepare(request, TurnOptions()).response


def test_a_gateway_response_conforms_and_a_broken_one_does_not() -> None:
    good = _response(tools=[{"type": "function", "name": "f"}])
    assert check_response(good) == []
    for field in ("presence_penalty", "frequency_penalty"):
        broken = {k: v for k, v in good.items() if k != field}
        assert any(field in v for v in check_response(broken)), field
    no_strict = {**good, "tools": [{"type": "function", "name": "f", "parameters": None}]}
    assert any("spec ResponseResource at tools/0" in v for v in check_response(no_strict))


def test_the_listed_deviations_pass_and_nothing_else_does() -> None:
    namespaced = _response(
        tools=[
            {
                "type": "namespace",
                "name": "ns",
                "description": "",
                "tools": [{"type": "function", "name": "f"}],
            },
            {"type": "custom", "name": "c"},
        ],
        reasoning={"effort": "minimal"},
        text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
    )
    assert check_response(namespaced) == []
    seq = {"sequence_number": 3, "item_id": "rs_1", "output_index": 0, "content_index": 0}
    assert check_event({"type": "response.reasoning_text.delta", "delta": "x", **seq}) == []
    assert (
        check_event({"type": "response.reasoning.delta", "delta": "x", **seq}) != []
    )  # not OpenAI's
    assert check_event({"type": "response.made_up", "sequence_number": 1}) != []
    flat = {
        "type": "error",
        "code": "server_error",
        "message": "m",
        "param": None,
        "sequence_number": 2,
    }
    assert check_event(flat) == []
    assert (
        check_ws_error({"type": "error", "status": 400, "error": {"code": None, "message": "m"}})
        != []
    )


def test_a_failed_responses_error_needs_a_type() -> None:
    failed = {**_response(), "status": "failed", "error": {"code": "server_error", "message": "m"}}
    assert any("error without a string type" in v for v in check_response(failed))
    typed = {**failed, "error": {"code": "server_error", "message": "m", "type": "server_error"}}
    assert check_response(typed) == []


def test_annotation_and_pass_through_events_are_checked() -> None:
    where = {"sequence_number": 4, "item_id": "msg_1", "output_index": 1, "content_index": 0}
    citation = {"type": "url_citation", "url": "https://x", "title": "X", "start_index": 0,
                "end_index": 3}  # fmt: skip
    added = {"type": "response.output_text.annotation.added", "annotation_index": 0, **where}
    assert check_event({**added, "annotation": citation}) == []
    assert check_event({**added}) != []  # no annotation
    progress = {"type": "response.web_search_call.searching", "sequence_number": 2,
                "item_id": "ws_1", "output_index": 0}  # fmt: skip
    assert check_event(progress) == []
    assert check_event({k: v for k, v in progress.items() if k != "item_id"}) != []


def test_every_deviation_is_in_the_docs() -> None:
    page = CONFORMANCE_PAGE.read_text()
    for key in DEVIATIONS:
        assert f"| `{key}` |" in page, key


def test_the_collector_fails_on_a_violation() -> None:
    collector = Collector()
    collector.add("response", {"id": "resp_1", "object": "response"})
    collector.add("event", b'{"type":"response.created","sequence_number":0}')
    assert len(collector.violations()) >= 2 and collector.seen == 2


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("recorded*.jsonl")))
async def test_recorded_scenarios_conform(name: str) -> None:
    """Each recorded exchange (`--tap-dir`), its backend bytes through today's pipeline:
    every event and the final Response conform."""
    recording = Recording.load(str(FIXTURES / name))
    events = await replay(recording)
    assert events, name
    problems = [p for event in events for p in check_event(event.data, name)]
    final = orjson.loads(events[-1].data)["response"]
    assert problems + check_response(final, name) == []


async def test_the_recorded_chat_stream_conforms() -> None:
    """tests/fixtures/streams/chat.sse (a backend's Chat stream for request.json)."""
    stream = "chat.sse"
    request = orjson.loads((FIXTURES / "request.json").read_bytes())
    lines = [{"kind": "client_request", "body": request}]
    lines.append({"kind": "backend_chunk", "data": (FIXTURES / stream).read_text()})
    recording = Recording(lines)
    events = await replay(recording)
    problems = [p for event in events for p in check_event(event.data, stream)]
    assert problems + check_response(orjson.loads(events[-1].data)["response"]) == []


def test_new_response_has_every_required_field() -> None:
    response = new_response({"model": "m"})
    assert check_response({**response, "status": "completed", "completed_at": 1}) == []
