"""OpenTelemetry traces (issue 32): off unless `OTEL_*` asks, one GenAI span per turn.

With the SDK's in-memory exporter installed (`tracing.install`): the turn's span (SERVER,
`chat {model}`, the GenAI attributes), its backend attempts (CLIENT, a `traceparent` sent
to the backend naming each one), the store operations under it, the compaction span, a
client's `traceparent` continued, failovers and fallbacks as one span per attempt, and the
API remote MCP calls use (`tracing.tool_call`, `outgoing_headers`). Off, no span and no
`traceparent` header. The real exporter against a real OTLP/HTTP receiver:
tests/test_tracing_otlp.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import websockets
from harness import GatewayHarness
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from scripted_backend import DONE, ScriptedBackend, Status, finish, refusing_url, text_chunks, usage

from streamer import tracing
from streamer.app import create_app
from streamer.config import Settings
from streamer.frontends.frontdoor import GuardedSite

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TEXT = [*text_chunks(["Hel", "lo"]), finish("stop"), usage(7, 2), DONE]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "gw"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_on_only_when_the_standard_environment_asks(
    env: dict[str, str], on: bool
) -> None:
    assert tracing.wanted(env) is on


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "otlp, console or none"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "over HTTP (http/protobuf)",
        ),
    ],
)
def test_an_exporter_the_gateway_lacks_is_refused_before_serving(
    env: dict[str, str], words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        tracing.check(env)


async def test_off_no_span_and_no_traceparent_reaches_the_backend() -> None:
    assert not tracing.enabled()
    assert tracing.span("anything") is tracing.NOOP
    assert tracing.start("anything", {}) is None and tracing.outgoing_headers() == {}
    async with GatewayHarness() as gw, sdk(gw.url) as client:
        await client.responses.create(
            model="m", input="hi", extra_headers={"traceparent": TRACEPARENT}
        )
        assert "traceparent" not in gw.backend.records[-1].headers


@pytest.mark.parametrize("fast_http", [True, False])  # both servers continue the trace
async def test_a_turn_is_one_genai_span_continuing_the_clients_trace(
    spans: InMemorySpanExporter, fast_http: bool
) -> None:
    async with GatewayHarness(fast_http=fast_http) as gw:
        gw.backend.script(TEXT)
        async with sdk(gw.url) as client:
            response = await client.responses.create(
                model="m", input="hi", max_output_tokens=50, temperature=0.5,
                extra_headers={"traceparent": TRACEPARENT},
            )  # fmt: skip
        sent = gw.backend.records[-1].headers.get("traceparent")
    (turn,) = named(spans, "chat m")[-1:]
    assert turn.kind is SpanKind.SERVER
    assert hex_id(turn.context.trace_id, 32) == TRACE_ID  # the client's trace
    assert turn.parent is not None and hex_id(turn.parent.span_id, 16) == CLIENT_SPAN
    attrs = dict(turn.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "m" and attrs["gen_ai.response.model"] == "m"
    assert attrs["gen_ai.response.id"] == response.id
    assert attrs["gen_ai.usage.input_tokens"] == 7 and attrs["gen_ai.usage.output_tokens"] == 2
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.request.max_tokens"] == 50 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["streamer.transport"] == "json" and attrs["streamer.replica"].startswith("http")
    assert turn.status.status_code is not StatusCode.ERROR
    # the backend call: a CLIENT child whose traceparent the backend got
    backend = _attempts(spans)
    assert len(backend) == 1 and backend[0].parent is not None
    assert backend[0].parent.span_id == turn.context.span_id
    battrs = dict(backend[0].attributes or {})
    assert battrs["server.address"] == "127.0.0.1" and isinstance(battrs["server.port"], int)
    assert sent == f"00-{TRACE_ID}-{hex_id(backend[0].context.span_id, 16)}-01"
    # the stored response: a store span under the turn
    (put,) = named(spans, "store put")
    assert put.parent is not None and put.parent.span_id == turn.context.span_id
    assert dict(put.attributes or {})["db.system.name"] == "memory"


async def test_without_a_traceparent_the_turn_starts_a_trace_and_a_failure_is_an_error(
    spans: InMemorySpanExporter,
) -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        gw.backend.script([Status(503, {"error": {"message": "busy", "code": "overloaded"}})])
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "x"}) as resp:
            assert resp.status == 503
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "y"}) as resp:
            assert resp.status == 200
    refused, served = _turn_spans(spans)
    assert refused.parent is None  # a trace of its own
    assert refused.status.status_code is StatusCode.ERROR
    attrs = dict(refused.attributes or {})
    assert attrs["error.type"] == "overloaded" and attrs["streamer.response.status"] == "refused"
    assert "gen_ai.response.finish_reasons" not in attrs
    assert dict(served.attributes or {})["streamer.response.status"] == "completed"


def _turn_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


def _attempts(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """The backend attempts (the store's spans are CLIENT spans too)."""
    return [s for s in named(exporter, "chat ") if s.kind is SpanKind.CLIENT]


FAILING_OVER = """
[[models]]
name = "a"
upstreams = ["{dead0}", "{dead1}"]
fallbacks = ["b"]

[[models]]
name = "b"
upstreams = ["{good}"]
"""


async def test_each_backend_attempt_is_a_span_failovers_and_fallback_included(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with ScriptedBackend() as good:
        path = tmp_path / "models.toml"
        path.write_text(
            FAILING_OVER.format(dead0=refusing_url(), dead1=refusing_url(), good=good.base_url)
        )
        settings = Settings(config=str(path), profile_probe=False, health_interval=0)
        runner = aiohttp.web.AppRunner(create_app(settings), handler_cancellation=True)
        await runner.setup()
        site = GuardedSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            async with sdk(f"http://127.0.0.1:{site.port}/v1") as client:
                response = await client.responses.create(model="a", input="hi")
        finally:
            await runner.cleanup()
    assert response.model == "b"
    (turn,) = _turn_spans(spans)
    attempts = _attempts(spans)
    assert [dict(s.attributes or {})["streamer.model"] for s in attempts] == ["a", "a", "b"]
    assert all(s.parent is not None and s.parent.span_id == turn.context.span_id for s in attempts)
    assert [s.status.status_code is StatusCode.ERROR for s in attempts] == [True, True, False]
    assert dict(turn.attributes or {})["gen_ai.response.model"] == "b"


async def test_a_compaction_turn_has_a_compaction_span_over_its_backend_call(
    spans: InMemorySpanExporter,
) -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "write a poem"},
            {"type": "compaction_trigger"},
        ],
        "store": False,
    }
    async with (
        GatewayHarness() as gw,
        aiohttp.ClientSession() as http,
        http.post(gw.url + "/responses", json=body) as resp,
    ):
        assert resp.status == 200
    (compaction,) = named(spans, "compaction")
    (turn,) = _turn_spans(spans)
    (backend,) = _attempts(spans)
    assert compaction.parent is not None and compaction.parent.span_id == turn.context.span_id
    assert backend.parent is not None and backend.parent.span_id == compaction.context.span_id
    attrs = dict(compaction.attributes or {})
    assert attrs["streamer.compaction.input_items"] == 2
    assert attrs["streamer.compaction.summary_chars"] > 0


def test_a_tool_call_is_an_execute_tool_span_whose_requests_carry_its_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("chat m", kind="server") as parent:
        assert parent is not None
        with tracing.tool_call("docs", "search", "call_1") as call:
            assert call is not None
            headers: dict[str, Any] = tracing.outgoing_headers()
        with pytest.raises(ConnectionError), tracing.tool_call("docs", "fetch"):
            raise ConnectionError("the MCP server went away")
    search, fetch = named(spans, "execute_tool")
    assert search.name == "execute_tool search" and search.kind is SpanKind.CLIENT
    assert search.parent is not None and search.parent.span_id == parent.get_span_context().span_id
    attrs = dict(search.attributes or {})
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "search" and attrs["gen_ai.tool.call.id"] == "call_1"
    assert attrs["streamer.mcp.server_label"] == "docs"
    assert headers["traceparent"].split("-")[2] == hex_id(search.context.span_id, 16)
    assert fetch.status.status_code is StatusCode.ERROR
    assert dict(fetch.attributes or {})["error.type"] == "ConnectionError"


async def test_store_operations_outside_a_trace_make_no_span(spans: InMemorySpanExporter) -> None:
    async with (
        GatewayHarness() as gw,
        aiohttp.ClientSession() as http,
        http.get(gw.url.removesuffix("/v1") + "/readyz") as resp,
    ):
        assert resp.status == 200
    assert spans.get_finished_spans() == ()


async def test_a_websockets_turns_continue_the_trace_of_its_upgrade(
    spans: InMemorySpanExporter,
) -> None:
    async with (
        GatewayHarness() as gw,
        websockets.connect(gw.ws_url, additional_headers={"traceparent": TRACEPARENT}) as ws,
    ):
        for _ in range(2):
            await ws.send(orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}))
            while orjson.loads(await ws.recv())["type"] != "response.completed":
                pass
    turns = _turn_spans(spans)
    assert len(turns) == 2
    for turn in turns:
        assert dict(turn.attributes or {})["streamer.transport"] == "websocket"
        assert hex_id(turn.context.trace_id, 32) == TRACE_ID
        assert turn.parent is not None and hex_id(turn.parent.span_id, 16) == CLIENT_SPAN


async def test_an_mcp_turns_list_and_call_are_spans_and_the_server_gets_their_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    from test_mcp import mcp_server, mcp_tool

    from streamer.core.mcp_servers import servers
    from streamer.mcp.client import McpClients, McpSettings
    from streamer.mcp.guard import HostRule

    clients = McpClients(McpSettings(HostRule.parse(["127.0.0.1"])))
    with mcp_server("--trace-id", TRACE_ID) as url:
        (server,) = servers([mcp_tool(url)])
        token = tracing.continue_trace({"traceparent": TRACEPARENT})
        try:
            listed = await clients.list_tools(server)
            output, error = await clients.call_tool(server, "lookup", {"term": "word"})
        finally:
            tracing.restore(token)
    assert listed and error is None and output
    (listing,) = named(spans, "mcp list_tools")
    (call,) = named(spans, "execute_tool")
    for span in (listing, call):  # each a child of the trace the server was sent
        assert hex_id(span.context.trace_id, 32) == TRACE_ID
        assert span.parent is not None and hex_id(span.parent.span_id, 16) == CLIENT_SPAN
    assert dict(call.attributes or {})["streamer.mcp.server_label"] == server.label
