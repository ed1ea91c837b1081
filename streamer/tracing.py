"""OpenTelemetry traces, off unless the standard `OTEL_*` environment variables ask for them.

`configure` (at `serve`) turns them on when `OTEL_TRACES_EXPORTER` names an exporter
(`otlp`, OTLP over HTTP/protobuf, or `console`) or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`
is set, and `OTEL_SDK_DISABLED` is not `true`; the SDK reads the rest itself (endpoint,
headers, timeout, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, the sampler, the batch
processor's bounds). The SDK is the optional extra `otel`; without it nothing is imported.

Off, every entry point here is one test of `_tracer is None` and gives back `None` or the
shared no-op `NOOP`: no span, no context, no allocation per request.

What the gateway traces (docs/observability.md): one span per turn (streamer/turns/genai_spans.py
names its GenAI attributes), inside it one per backend attempt (a `traceparent` sent to the
backend), store operations and compaction; other code (remote MCP calls) opens its own with
`span` / `tool_call` and sends `outgoing_headers()`. An incoming `traceparent`
(`continue_trace`) makes the turn a child of the client's span.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("streamer.tracing")

_tracer: Tracer | None = None  # None: tracing is off
_provider: TracerProvider | None = None
_owned = False  # the provider is ours to shut down (not a test's)

Attributes = Mapping[str, Any]


class _Noop:
    """The span context of tracing off: `with span(...) as s` gives None."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NOOP = _Noop()


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return any(name.strip() not in ("", "none") for name in exporters.split(","))
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return bool(endpoint)


def check(env: Mapping[str, str] = os.environ) -> None:
    """Refuse (ValueError), before serving, an environment asking for traces this gateway
    cannot send: the `otel` extra not installed, an exporter or protocol it lacks."""
    if not wanted(env):
        return
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ValueError(
            "OTEL_* asks for traces but OpenTelemetry is not installed: "
            "pip install 'streamer-gateway[otel]'"
        ) from None
    for name in _exporter_names(env):
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                raise ValueError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: this gateway sends OTLP "
                    "over HTTP (http/protobuf)"
                )
        elif name != "console":
            raise ValueError(f"OTEL_TRACES_EXPORTER {name!r}: otlp, console or none")


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    return [n.strip() for n in names.split(",") if n.strip() not in ("", "none")]


def configure(env: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on if the environment asks for it (`check` first); whether it is on."""
    if not wanted(env):
        return False
    check(env)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from streamer import __version__

    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "streamer-gateway"}))
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider, owned=True)
    log.info("tracing on: %s", ", ".join(_exporter_names(env)))
    return True


def _exporters(env: Mapping[str, str]) -> Iterator[Any]:
    for name in _exporter_names(env):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            yield OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*
        else:
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            yield ConsoleSpanExporter()


def install(provider: TracerProvider | None, *, owned: bool = False) -> None:
    """Trace into `provider` (None: off). Tests install one with an in-memory exporter."""
    global _tracer, _provider, _owned
    _provider, _owned = provider, owned
    _tracer = provider.get_tracer("streamer") if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


def shutdown() -> None:
    """Export what is left and stop (blocking: called off the event loop at shutdown)."""
    provider = _provider
    if provider is not None and _owned:
        install(None)
        provider.shutdown()


def continue_trace(headers: Mapping[str, str]) -> object | None:
    """An incoming request's `traceparent` (and `tracestate`, baggage) made the current
    context, so that its turn is a child of the client's span; the token for `restore`."""
    if _tracer is None or "traceparent" not in headers:
        return None
    from opentelemetry import context, propagate

    return context.attach(propagate.extract(headers))


def restore(token: object | None) -> None:
    """Undo `continue_trace` (or `enter`)."""
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]


def start(name: str, attributes: Attributes, kind: str = "internal") -> Span | None:
    """A span, child of the current one, not made current (`enter` makes it so); None off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    return _tracer.start_span(name, kind=SpanKind[kind.upper()], attributes=attributes)


def enter(span: Span | None) -> object | None:
    """Make `span` the current one (its children are its own); a token for `restore`."""
    if span is None:
        return None
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def end(span: Span | None, attributes: Attributes | None = None, error: str | None = None) -> None:
    """End `span` with its last attributes; `error` (the error.type) marks it failed."""
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def headers_for(span: Span | None, headers: dict[str, str] | None) -> dict[str, str] | None:
    """`headers` with `span`'s `traceparent` (a copy; `headers` itself when `span` is None)."""
    if span is None:
        return headers
    from opentelemetry import propagate, trace

    carrier = dict(headers or {})
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def outgoing_headers() -> dict[str, str]:
    """The current span's `traceparent` for a request this gateway makes ({} off)."""
    if _tracer is None:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def in_trace() -> bool:
    """Whether a trace is under way here (a turn's span, or a client's `traceparent`)."""
    if _tracer is None:
        return False
    from opentelemetry import trace

    return trace.get_current_span().get_span_context().is_valid


def span(
    name: str, attributes: Attributes | None = None, kind: str = "internal", *, nested: bool = False
) -> contextlib.AbstractContextManager[Span | None]:
    """`with span(name, attrs) as s:` a current span over the block (an exception marks it
    failed, with its class as `error.type`); `s` is None off. `nested`: only inside a
    trace already under way (store operations: a readiness ping starts no trace)."""
    if _tracer is None or (nested and not in_trace()):
        return NOOP
    return _current(name, attributes or {}, kind)


@contextlib.contextmanager
def _current(name: str, attributes: Attributes, kind: str) -> Iterator[Span | None]:
    made = start(name, attributes, kind)
    token = enter(made)
    try:
        yield made
    except BaseException as exc:
        end(made, error=type(exc).__qualname__)
        made = None
        raise
    finally:
        restore(token)
        end(made)


def tool_call(
    server: str, tool: str, call_id: str | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A remote tool call the gateway makes (MCP), as the GenAI conventions name it; send
    `outgoing_headers()` with its requests inside the block."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if server:
        attributes["streamer.mcp.server_label"] = server
    return span(f"execute_tool {tool}", attributes, "client")
