"""The real exporter: a gateway process configured only by `OTEL_*` environment variables
sends its spans over OTLP/HTTP (protobuf) to a receiver on loopback (aiohttp, decoding the
export with opentelemetry-proto's own messages), and what it holds at SIGTERM still goes
out. The spans arrive with the resource (`OTEL_SERVICE_NAME`, the version), the turn's
GenAI attributes, and the client's trace id; the backend got a `traceparent` naming the
backend span."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from builders import gateway_process
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from scripted_backend import DONE, ScriptedBackend, finish, text_chunks, usage

from streamer import __version__

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


class Receiver:
    """`POST /v1/traces` as a collector takes it: each export decoded and kept."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        self.content_types: set[str] = set()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.exports.append(export)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, with its resource's attributes."""
        found = []
        for export in self.exports:
            for resource_spans in export.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope.spans]
        return found


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: value(pair.value) for pair in pairs}


async def test_spans_reach_a_real_otlp_http_receiver_from_a_gateway_set_up_by_otel_env(
    tmp_path: Path,
) -> None:
    script = [*text_chunks(["Hi", "!"]), finish("stop"), usage(11, 3), DONE]
    async with Receiver() as receiver, ScriptedBackend(default_script=script) as backend:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_SERVICE_NAME": "gateway-under-test",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        }
        args = ("--upstream", backend.base_url)
        async with gateway_process(tmp_path / "gw.log", *args, env=env) as gw:
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    gw.url + "/responses",
                    json={"model": "m", "input": "hello"},
                    headers={"traceparent": TRACEPARENT},
                ) as resp,
            ):
                assert resp.status == 200
                response = orjson.loads(await resp.read())
            assert await gw.terminate() == 0  # the batch still held is exported at exit
            sent = backend.records[-1].headers["traceparent"]
    assert receiver.content_types == {"application/x-protobuf"}
    spans = receiver.spans()
    resource = spans[0][0]
    assert resource["service.name"] == "gateway-under-test"
    assert resource["service.version"] == __version__
    assert resource["deployment.environment"] == "test"
    by_kind = {span.kind: span for _, span in spans if span.name == "chat m"}
    turn, backend_call = by_kind[Span.SPAN_KIND_SERVER], by_kind[Span.SPAN_KIND_CLIENT]
    assert turn.trace_id.hex() == TRACE_ID and turn.parent_span_id.hex() == "b7ad6b7169203331"
    assert backend_call.parent_span_id == turn.span_id
    assert sent == f"00-{TRACE_ID}-{backend_call.span_id.hex()}-01"
    attrs = attributes(turn.attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.response.id"] == response["id"]
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (11, 3)
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]


async def test_an_otel_environment_the_gateway_cannot_serve_stops_it_with_a_message() -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamer", "serve", "--port", "0",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "this gateway sends OTLP over HTTP (http/protobuf)" in err.decode()
    assert "Traceback" not in err.decode()
