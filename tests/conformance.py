"""Validate what the gateway emits against the Open Responses spec and the OpenAI SDK's types.

`check_response`, `check_event`, `check_ws_error` and `check_http_error` return the
violations of one payload (an empty list when it conforms). Each payload is checked twice:
against the OpenAI SDK's models (tests/sdk_models.py), and against the Open Responses
OpenAPI document (tests/fixtures/spec/openresponses.json) with
jsonschema. Where OpenAI's form differs from the spec and clients need OpenAI's, the spec
check allows exactly that difference; every such deviation is a row of `DEVIATIONS` (and
of docs/conformance.md's table), nothing else is let through.

`Collector` is what tests/conftest.py installs around every test: it records each Response,
event, and error the gateway produces in-process and checks them at the test's end.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from openai.types.responses import ResponseStreamEvent
from pydantic import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from sdk_models import validate_event, validate_response

_SPEC = Path(__file__).parent / "fixtures" / "spec" / "openresponses.json"
_URI = "urn:openresponses"

# OpenAI's forms the spec does not have, kept because clients need them (reason beside each).
DEVIATIONS: dict[str, str] = {
    "tools.extensions": "namespace, custom and tool_search tools are OpenAI extensions the "
    "spec has no schema for (Codex and the Agents SDK send them); checked by the SDK only",
    "tools.hosted": "hosted tools (web_search, file_search, mcp, ...) are echoed as the client "
    "sent them: the gateway neither runs nor forwards them; not checked",
    "items.extensions": "custom_tool_call, tool_search_call, tool_search_output, "
    "local_shell_call, shell_call and apply_patch_call output items are OpenAI extensions; "
    "checked by the SDK only",
    "items.hosted": "hosted tool calls (web_search_call, file_search_call, mcp_call, ...) that "
    "a Responses backend ran (--upstream-api responses) pass through as it sent them; the "
    "spec has no schema for them; checked by the SDK only",
    "events.foreign": "event types the gateway does not make, streamed by a Responses backend "
    "(a hosted call's progress such as response.web_search_call.searching, a vendor's own), "
    "pass through in stream order with the gateway's sequence_number, item_id and "
    "output_index, after their item's output_item.added; hosted progress events are checked "
    "by the SDK only",
    "events.mcp_call_arguments": "response.mcp_call_arguments.delta/done stream the "
    "arguments of an MCP call the gateway runs (OpenAI's events; the spec has none); "
    "checked by the SDK only",
    "events.reasoning_text": "OpenAI names the reasoning text events "
    "response.reasoning_text.delta/done (the spec: response.reasoning.delta/done); Codex and "
    "the SDK read only OpenAI's names",
    "events.custom_tool_call_input": "response.custom_tool_call_input.delta/done stream a "
    "custom tool's input (OpenAI extension); checked by the SDK only",
    "text.format.schema": "a json_schema format echoes its `schema` object as OpenAI does; "
    "the spec types `schema` as null",
    "tool_choice.extensions": "tool_choice {type: custom}, {type: shell}, {type: "
    "apply_patch}, {type: mcp} and allowed_tools over custom tools are OpenAI extensions; checked by the "
    "SDK only",
    "tool_choice.namespace": "tool_choice {type: namespace, name} (this gateway's extension: "
    "any tool of that namespace) is echoed as sent; neither the spec nor the SDK has it",
    "echo.open_enums": "the request's enum-like strings (reasoning effort and summary, text "
    "verbosity, service tier) are echoed as sent, so values newer than the SDK or the spec "
    "(OpenAI's `minimal` effort, which the spec lacks) keep working; checked as strings",
    "error.code.context_length_exceeded": "response.failed carries `context_length_exceeded`, "
    "the code Codex acts on (it trims and retries); the SDK's enum of codes lacks it",
    "events.error.flat": "the SSE `error` event keeps OpenAI's flat code/message/param: the "
    "spec nests them in an `error` object, and the OpenAI SDK raises an APIError on an "
    "`error` event with an `error` object instead of yielding the event",
}
_OURS = frozenset({"function", "custom", "namespace", "tool_search"})  # tools the gateway serves
_SDK_UNKNOWN_CODES = frozenset({"context_length_exceeded"})

_RENAMED_EVENTS = {
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
}
_SDK_ONLY_EVENTS = frozenset(
    {
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
    }
)  # fmt: skip
_HOSTED_ITEMS = frozenset(
    {
        "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
        "computer_call", "mcp_call", "mcp_list_tools", "mcp_approval_request",
    }
)  # fmt: skip
_EXTENSION_ITEMS = (
    frozenset(
        {
            "custom_tool_call",
            "tool_search_call",
            "tool_search_output",
            "local_shell_call",
            "shell_call",
            "apply_patch_call",
        }
    )
    | _HOSTED_ITEMS
)
_EXTENSION_CHOICES = frozenset({"custom", "shell", "apply_patch", "mcp"})
_RESPONSE_EVENTS = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)


@cache
def spec() -> dict[str, Any]:
    return json.loads(_SPEC.read_text())


@cache
def _registry() -> Registry[Any]:
    resource = Resource.from_contents(spec(), default_specification=DRAFT202012)
    return Registry().with_resource(_URI, resource)


@cache
def validator(name: str) -> Draft202012Validator:
    """A validator for one of the spec's `components.schemas`."""
    schema = {"$ref": f"{_URI}#/components/schemas/{name}"}
    return Draft202012Validator(schema, registry=_registry())


@cache
def event_schemas() -> dict[str, str]:
    """Streaming event type -> the spec's schema name."""
    out = {}
    for name, schema in spec()["components"]["schemas"].items():
        if name.endswith("StreamingEvent"):
            out[schema["properties"]["type"]["enum"][0]] = name
    return out


def _errors(name: str, value: Any, where: str) -> list[str]:
    return [
        f"{where}: spec {name} at {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message[:300]}"
        for e in validator(name).iter_errors(value)
    ]


def _is_extension_tool(tool: Any) -> bool:
    return not (isinstance(tool, dict) and tool.get("type") == "function")


def _spec_view(response: dict[str, Any]) -> dict[str, Any]:
    """The Response with the allowed deviations taken out (see DEVIATIONS)."""
    view = {**response, **_open_enums(response)}
    view["tools"] = [t for t in response.get("tools") or [] if not _is_extension_tool(t)]
    view["output"] = [
        item for item in response.get("output") or [] if item.get("type") not in _EXTENSION_ITEMS
    ]
    text = view.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        fmt = text["format"]
        if fmt.get("type") == "json_schema":
            view["text"] = {**text, "format": {**fmt, "schema": None}}
    choice = response.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "namespace":
        view["tool_choice"] = "auto"
    if isinstance(choice, dict) and choice.get("type") in ("custom", "allowed_tools"):
        tools = choice.get("tools") or []
        if choice.get("type") == "custom" or any(t.get("type") != "function" for t in tools):
            view["tool_choice"] = "auto"
    if isinstance(choice, dict) and choice.get("type") in _EXTENSION_CHOICES:
        view["tool_choice"] = "auto"
    return view


@cache
def _sdk_event_models() -> dict[str, Any]:
    """Event type -> the SDK's model of it (to report one member's errors, not the union's)."""
    members = typing.get_args(typing.get_args(ResponseStreamEvent)[0])
    return {m.model_fields["type"].annotation.__args__[0]: m for m in members}


def _sdk_event(event: dict[str, Any]) -> Any:
    """The event by the SDK's model of its type (what the SDK's discriminated union picks,
    with that model's own errors); an unknown type through the union itself."""
    model = _sdk_event_models().get(event.get("type"))
    if model is not None:
        return model.model_validate(event)
    return validate_event(event)


def _sdk(check: Callable[[Any], Any], value: Any, where: str) -> list[str]:
    try:
        check(value)
    except ValidationError as exc:  # the union members' own errors, not "wrong tag" ones
        found = [e for e in exc.errors() if e["type"] != "literal_error"] or exc.errors()
        shown = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in found[:4])
        return [f"{where}: OpenAI SDK: {shown[:600]}"]
    except AssertionError as exc:
        return [f"{where}: OpenAI SDK: {exc}"]
    return []


def _open_enums(response: dict[str, Any]) -> dict[str, Any]:
    """`echo.open_enums`: each echoed enum-like string, once checked to be a string (or
    null), replaced by a value every schema takes."""
    out: dict[str, Any] = {}
    reasoning, text = response.get("reasoning"), response.get("text")
    if isinstance(reasoning, dict):
        known = {k: reasoning.get(k) for k in ("effort", "summary")}
        if all(v is None or isinstance(v, str) for v in known.values()):
            out["reasoning"] = {**reasoning, "effort": None, "summary": None}
    if isinstance(text, dict) and isinstance(text.get("verbosity"), str):
        out["text"] = {**text, "verbosity": "medium"}
    if isinstance(response.get("service_tier"), str):
        out["service_tier"] = "default"
    return out


def _sdk_view(response: dict[str, Any]) -> dict[str, Any]:
    """The Response with the deviations the SDK's types lack taken out (see DEVIATIONS)."""
    view = {**response, **_open_enums(response)}
    tools = response.get("tools")
    if isinstance(tools, list):
        view["tools"] = [t for t in tools if not isinstance(t, dict) or t.get("type") in _OURS]
    error = response.get("error")
    if isinstance(error, dict) and error.get("code") in _SDK_UNKNOWN_CODES:
        view = {**view, "error": {**error, "code": "server_error"}}
    choice = response.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "namespace":
        view = {**view, "tool_choice": "auto"}
    return view


def check_response(response: dict[str, Any], where: str = "response") -> list[str]:
    errors = _sdk(validate_response, _sdk_view(response), where)
    return (
        errors
        + _errors("ResponseResource", _spec_view(response), where)
        + _error_type(response, where)
    )


def _error_type(response: dict[str, Any], where: str) -> list[str]:
    """A failed Response's `error` carries a string `type` beside `code` and `message`: the
    spec and the OpenAI SDK need only those two, the Vercel AI SDK all three (it rejects the
    whole Response otherwise: "Invalid JSON response")."""
    error = response.get("error")
    if isinstance(error, dict) and not isinstance(error.get("type"), str):
        return [f"{where}: error without a string type: {error!r:.200}"]
    return []


def _is_hosted_progress(kind: Any) -> bool:
    """`response.web_search_call.searching` and the like: a hosted call's progress, passed
    on from a Responses backend that ran it (the SDK knows them, the spec does not)."""
    parts = kind.split(".") if isinstance(kind, str) else []
    return len(parts) > 2 and parts[1] in _HOSTED_ITEMS


def check_event(data: bytes | dict[str, Any], where: str = "event") -> list[str]:
    event = orjson.loads(data) if isinstance(data, bytes) else data
    kind = event.get("type")
    where = f"{where} {kind} #{event.get('sequence_number')}"
    if kind in _RESPONSE_EVENTS and isinstance(event.get("response"), dict):
        errors = _sdk(_sdk_event, {**event, "response": _sdk_view(event["response"])}, where)
    else:
        errors = _sdk(_sdk_event, event, where)
    if kind in _SDK_ONLY_EVENTS or _is_hosted_progress(kind):
        return errors
    item = event.get("item")
    if isinstance(item, dict) and item.get("type") in _EXTENSION_ITEMS:
        return errors
    spec_kind = _RENAMED_EVENTS.get(kind, kind)
    name = event_schemas().get(spec_kind)
    if name is None:
        return [*errors, f"{where}: not an event of the spec, nor a listed deviation"]
    event = {**event, "type": spec_kind}
    if kind == "error" and "error" not in event:
        fields = {k: event.pop(k) for k in ("code", "message", "param") if k in event}
        event["error"] = {"type": "server_error", **fields}
    if kind in _RESPONSE_EVENTS and isinstance(event.get("response"), dict):
        event = {**event, "response": _spec_view(event["response"])}
    return errors + _errors(name, event, where)


def check_ws_error(event: dict[str, Any], where: str = "websocket error") -> list[str]:
    return _errors("WebSocketErrorEvent", event, where)


def check_http_error(body: dict[str, Any], where: str = "http error") -> list[str]:
    """OpenAI's error body: all four keys present, message and type strings."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return [f"{where}: no error object: {body!r:.200}"]
    missing = [k for k in ("message", "type", "param", "code") if k not in error]
    wrong = [k for k in ("message", "type") if not isinstance(error.get(k), str)]
    wrong += [
        k for k in ("param", "code") if error.get(k) is not None and not isinstance(error[k], str)
    ]
    if missing or wrong:
        return [f"{where}: missing {missing} / wrong type {wrong}: {error!r:.300}"]
    return []


def check_json(body: Any, where: str = "json") -> list[str]:
    """A JSON answer of a /v1/responses route: a Response, a list of items, or other."""
    if not isinstance(body, dict):
        return []
    if body.get("object") == "response" and "output" in body:
        return check_response(body, where)
    return []


@dataclass
class Collector:
    """What one test received from the gateway, checked at its end."""

    records: list[tuple[str, Any]] = field(default_factory=list)
    seen: int = 0

    def add(self, kind: str, payload: Any) -> None:
        self.records.append((kind, payload))

    def violations(self) -> list[str]:
        out: list[str] = []
        for kind, payload in self.records:
            self.seen += 1
            out.extend(_checked(kind, payload))
        return out


_CHECKS: dict[str, Callable[[Any, str], list[str]]] = {
    "event": check_event,
    "response": check_response,
    "json": check_json,
    "ws_error": check_ws_error,
    "http_error": check_http_error,
}
_MEMO: dict[tuple[str, bytes], list[str]] = {}  # the checks are pure: a payload seen is known
_MEMO_LIMIT = 4096


def _checked(kind: str, payload: Any) -> list[str]:
    try:
        key = (kind, payload if isinstance(payload, bytes) else orjson.dumps(payload))
    except TypeError:  # not JSON the gateway could have sent: checked, not remembered
        return _CHECKS[kind](payload, kind)
    found = _MEMO.get(key)
    if found is None:
        found = _CHECKS[kind](payload, kind)
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        _MEMO[key] = found
    return found
