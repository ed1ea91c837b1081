"""One request through the gateway: names -> lowering -> upstream -> streamer -> events.

`prepare` is pure: it validates the client's request, builds the tool map once, lowers
the request for the backend and builds the `OutputItemStreamer`. `stream_events` runs
the turn against an upstream and yields batches of encoded events; `collect` is the
same run for non-streaming requests. Every frontend goes through these three.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .deltas import Delta
from .errors import RequestError, invalid
from .events import Event
from .lowering import LoweringOptions, lower, normalize_input
from .output import OutputItemStreamer
from .response import new_response
from .tools import NamingConfig, ResponsesToolNames

log = logging.getLogger("streamer.pipeline")


class UpstreamStream(Protocol):
    def __aiter__(self) -> AsyncIterator[list[Delta]]: ...
    async def aclose(self) -> None: ...

    @property
    def ready(self) -> bool:
        """Deltas can be had without waiting (the backend's first bytes came with its head)."""
        ...

    @property
    def exhausted(self) -> bool:
        """No more deltas will come (the backend's end has been read whole)."""
        ...


class Upstream(Protocol):
    """What the pipeline needs of a backend client (see streamer/upstream/chat.py)."""

    async def open(
        self,
        chat_request: dict[str, Any],
        *,
        headers: dict[str, str] | None = None,
        on_raw: Callable[[bytes], None] | None = None,
        client: str = "",
    ) -> UpstreamStream: ...


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """Per-gateway settings that shape every turn."""

    naming: NamingConfig = field(default_factory=NamingConfig)
    lowering: LoweringOptions = field(default_factory=LoweringOptions)
    max_input_items: int = 10_000


@dataclass(slots=True)
class Turn:
    """Everything one response needs, built once per request."""

    request: dict[str, Any]
    items: list[dict[str, Any]]  # the effective input: history, then the new items
    names: ResponsesToolNames
    chat_request: dict[str, Any]
    streamer: OutputItemStreamer
    headers: dict[str, str] = field(default_factory=dict)
    client: str = ""  # who asked (streamer.identity): pools and stored responses are per client

    @property
    def response(self) -> dict[str, Any]:
        return self.streamer.response


_TYPES: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("model", str, "a string"),
    ("instructions", str, "a string"),
    ("tools", list, "an array"),
    ("tool_choice", (str, dict), "a string or an object"),
    ("stream", bool, "a boolean"),
    ("store", bool, "a boolean"),
    ("background", bool, "a boolean"),
    ("parallel_tool_calls", bool, "a boolean"),
    ("previous_response_id", str, "a string"),
    ("metadata", dict, "an object"),
    ("text", dict, "an object"),
    ("reasoning", dict, "an object"),
    ("max_output_tokens", int, "an integer"),
    ("temperature", (int, float), "a number"),
    ("top_p", (int, float), "a number"),
    # echoed into the Response as sent: a wrong type would make the Response itself invalid
    ("truncation", str, "a string"),
    ("service_tier", str, "a string"),
    ("user", str, "a string"),
    ("safety_identifier", str, "a string"),
    ("prompt_cache_key", str, "a string"),
    ("prompt_cache_retention", str, "a string"),
    ("max_tool_calls", int, "an integer"),
    ("top_logprobs", int, "an integer"),
    ("prompt", dict, "an object"),
    ("include", list, "an array"),
    ("conversation", (str, dict), "a string or an object"),
    ("reasoning.effort", str, "a string"),
    ("reasoning.summary", str, "a string"),
    ("text.format", dict, "an object"),
    ("text.verbosity", str, "a string"),
)
_TRUNCATION = ("auto", "disabled")
_FORMATS = ("text", "json_object", "json_schema")
# Parameters that need OpenAI-hosted state this gateway does not have.
_UNSUPPORTED = (
    (
        "conversation",
        "Conversations are not supported by this gateway; use 'previous_response_id'.",
    ),
    ("prompt", "Stored prompt templates are not supported by this gateway; send 'instructions'."),
)


# The same table by field, for the pass that finds nothing wrong (nearly every request)
# looking only at the fields the body has.
_TOP = {name: kind for name, kind, _ in _TYPES if "." not in name}
_NESTED: dict[str, dict[str, type | tuple[type, ...]]] = {}
for _name, _kind, _ in _TYPES:
    if "." in _name:
        _parent, _, _child = _name.partition(".")
        _NESTED.setdefault(_parent, {})[_child] = _kind


def _all_typed(body: dict[str, Any]) -> bool:
    for name, value in body.items():
        kind = _TOP.get(name)
        if kind is None or value is None:
            continue
        if not _is(value, kind):
            return False
        nested = _NESTED.get(name)
        if nested is not None:
            for child, kind in nested.items():
                inner = value.get(child)
                if inner is not None and not _is(inner, kind):
                    return False
    return True


def _field(body: dict[str, Any], path: str) -> Any:
    """`a.b`: body["a"]["b"], None when absent (parents are type-checked first)."""
    head, _, tail = path.partition(".")
    value = body.get(head)
    return value.get(tail) if tail and isinstance(value, dict) else (None if tail else value)


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true is not a number
        return kind is bool or (isinstance(kind, tuple) and bool in kind)
    return isinstance(value, kind)


def _check_format(fmt: dict[str, Any]) -> None:
    """`text.format`: one of the three Responses formats (echoed in the Response as sent)."""
    kind = fmt.get("type")
    if kind not in _FORMATS:
        raise invalid(
            f"Invalid value for 'text.format.type': {kind!r}. "
            "Supported values are: 'text', 'json_object' and 'json_schema'.",
            "text.format.type",
            "invalid_value",
        )
    if kind == "json_schema" and not isinstance(fmt.get("name"), str):
        raise invalid(
            "Missing required parameter: 'text.format.name'.",
            "text.format.name",
            "missing_required_parameter",
        )


def validate_request(body: Any, *, model_required: bool = True) -> dict[str, Any]:
    """Top-level shape checks with OpenAI's messages and `param` names."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    if not _all_typed(body):  # then the first wrong field, in the table's order
        for name, kind, what in _TYPES:
            value = _field(body, name)
            if value is not None and not _is(value, kind):
                raise invalid(f"Invalid type for '{name}': expected {what}.", name, "invalid_type")
    if body.get("truncation") not in (None, *_TRUNCATION):
        raise invalid(
            f"Invalid value for 'truncation': {body['truncation']!r}. "
            "Supported values are: 'auto' and 'disabled'.",
            "truncation",
            "invalid_value",
        )
    fmt = _field(body, "text.format")
    if fmt is not None:
        _check_format(fmt)
    for key, value in (body.get("metadata") or {}).items():
        if not isinstance(value, str):
            raise invalid(
                f"Invalid type for 'metadata.{key}': expected a string.",
                f"metadata.{key}",
                "invalid_type",
            )
    if model_required and not body.get("model"):
        raise invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if body.get("previous_response_id") and body.get("conversation"):
        raise invalid(
            "'previous_response_id' cannot be used together with 'conversation'.",
            "previous_response_id",
        )
    for name, message in _UNSUPPORTED:
        if body.get(name) is not None:  # ignoring these would silently change the answer
            raise invalid(message, name, "unsupported_parameter")
    return body


def prepare(
    request: dict[str, Any],
    options: TurnOptions,
    *,
    history: Sequence[Mapping[str, Any]] = (),
    response_id: str | None = None,
) -> Turn:
    """Validate and lower one request. `history` is the continued response's input+output."""
    validate_request(request, model_required=options.lowering.model is None)
    # null means "not given" in OpenAI's API: the Response echoes the default, never null
    request = {k: v for k, v in request.items() if v is not None}
    new_items = normalize_input(request.get("input", []))
    items = [*history, *new_items] if history else new_items
    if len(items) > options.max_input_items:
        raise invalid(
            f"Too many input items: {len(items)} (at most {options.max_input_items}).", "input"
        )
    names = ResponsesToolNames.convert(request.get("tools"), items, config=options.naming)
    chat_request = lower(request, items, names, options.lowering)
    response = new_response(request, response_id=response_id)
    return Turn(request, items, names, chat_request, OutputItemStreamer(names, response))


async def stream_events(
    turn: Turn, upstream: Upstream, *, on_raw: Callable[[bytes], None] | None = None
) -> AsyncIterator[list[Event]]:
    """Run the turn; yield one batch of events per upstream read.

    The upstream is opened before the first event, so that a backend that refuses the
    request (4xx/5xx, unreachable) surfaces as a `RequestError` with nothing sent yet.
    Closing this generator (the client went away) closes the backend request at once.
    """
    streamer = turn.streamer
    headers = turn.headers or None
    if on_raw is None:  # the client picks the backend connections: only its own requests use them
        stream = await upstream.open(turn.chat_request, headers=headers, client=turn.client)
    else:  # record the backend's bytes as they come (`--tap-dir`)
        stream = await upstream.open(
            turn.chat_request, headers=headers, on_raw=on_raw, client=turn.client
        )
    unsent = streamer.start()  # events made but not yet yielded: a failure sends them first
    try:
        deltas_of = aiter(stream)
        if stream.ready:  # the first deltas are there already: they leave with `created`
            with contextlib.suppress(StopAsyncIteration):
                unsent += streamer.feed(await anext(deltas_of))
            if stream.exhausted:
                unsent += streamer.finish()
        first, unsent = unsent, []
        yield first
        if streamer.done:
            return
        async for deltas in deltas_of:
            events = streamer.feed(deltas)
            if stream.exhausted:  # the end is in: the terminal event leaves in this write
                events += streamer.finish()
            if events:
                yield events
            if streamer.done:
                return
        yield streamer.finish()
    except RequestError as exc:
        yield unsent + streamer.fail(exc.code or "server_error", exc.message)
    except Exception:
        # A bug must still end the stream well-formed, never as a torn connection.
        log.exception("turn %s failed", turn.response["id"])
        yield unsent + streamer.fail(
            "server_error", "The gateway failed while streaming the response."
        )
    finally:
        await stream.aclose()


async def collect(events: AsyncIterator[list[Event]], turn: Turn) -> dict[str, Any]:
    """A non-streaming request: the same run, events dropped, the final response kept."""
    async for _ in events:
        pass
    return turn.response


def warmup(turn: Turn) -> list[Event]:
    """WebSocket `generate:false`: created then completed, empty output, no backend call."""
    return turn.streamer.start(in_progress=False) + turn.streamer.finish()
