"""Property-based fuzzing of the real gateway on loopback: bodies, tools, items, WebSocket frames.

Every answer must be a valid response (checked against the SDK's typed models) or a 4xx in
OpenAI's error shape, with a `param` whenever the body parsed as a JSON object (some field
is then at fault); never a 5xx, an error-level log line (a traceback), or a dropped
connection. Requests that pass must reach the backend with flat, legal function tools only,
and a call to any of them must come back under the identity the request declared.

One gateway per module. CI runs `STREAMER_FUZZ_EXAMPLES` (default 60) examples per test;
`make fuzz` runs the `slow` twins with 5000.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from builders import parse_sse
from harness import GatewayHarness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_backend import DONE, finish, text_chunks, tool_call_chunks, usage
from sdk_models import validate_event, validate_response

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = int(os.environ.get("STREAMER_FUZZ_EXAMPLES", "60"))
LONG_EXAMPLES = int(os.environ.get("STREAMER_FUZZ_EXAMPLES", "5000"))
COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
CI = settings(max_examples=EXAMPLES, **COMMON)
LONG = settings(max_examples=LONG_EXAMPLES, **COMMON)

# Small limits, so that generated requests sometimes cross them.
LIMITS = {
    "max_tools": 24,
    "max_tool_bytes": 16 * 1024,
    "max_input_items": 24,
    "max_body_bytes": 256 * 1024,
    "ws_max_message_bytes": 256 * 1024,
}
LEGAL_FLAT = re.compile(r"[A-Za-z0-9_-]{1,64}")
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})

# -- strategies ---------------------------------------------------------------------------

SAFE_TEXT = st.text(st.characters(codec="utf-8"), max_size=24)
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
)
JSON_ANY = st.recursive(
    JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Names a client may declare: identifiers, and everything an attacker or a bug might send.
HOSTILE_NAMES = [
    "../etc/passwd", "..\\..\\windows", "http://evil.example/x?y=1", "file:///etc/shadow",
    "__proto__", "constructor", "prototype", "a.b.c", "mcp__docs__search", "functions",
    "ns/../../x", "名前", "emoji😀", "a b", " ", "\u202eevil", "null", "tool\x00x", "$(rm -rf /)",
    "x" * 200, "-", "_", "__", "multi_tool_use.parallel", "web_search", "exec_command",
]  # fmt: skip
NAMES = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    st.sampled_from(HOSTILE_NAMES),
    st.text(max_size=70),
)
OPTIONAL_NAMES = NAMES | st.none() | JSON_ANY
CALL_IDS = st.sampled_from(["call_1", "call_2", "call_abc"]) | st.text(max_size=12)
SCHEMAS = st.sampled_from(
    [
        {"type": "object", "properties": {}},
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False},
    ]
)


def _sometimes(strategy: st.SearchStrategy[Any], garbage: st.SearchStrategy[Any] = JSON_ANY):
    """Mostly `strategy`, now and then anything at all."""
    return st.one_of(strategy, strategy, strategy, garbage)


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None):
    return st.fixed_dictionaries(required, optional=optional or {})


FUNCTION_TOOL = _obj(
    {"type": st.just("function"), "name": NAMES},
    {"description": _sometimes(SAFE_TEXT), "parameters": _sometimes(SCHEMAS), "strict": _sometimes(st.booleans())},
)  # fmt: skip
CUSTOM_TOOL = _obj(
    {"type": st.just("custom"), "name": NAMES},
    {
        "description": SAFE_TEXT,
        "format": _sometimes(
            st.sampled_from(
                [
                    {"type": "text"},
                    {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                    {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
                ]
            )
        ),
    },
)
MEMBER = st.one_of(FUNCTION_TOOL, FUNCTION_TOOL, CUSTOM_TOOL, JSON_ANY)
NAMESPACE_TOOL = _obj(
    {"type": st.just("namespace"), "name": NAMES, "tools": st.lists(MEMBER, max_size=4)},
    {"description": _sometimes(SAFE_TEXT)},
)
HOSTED_TOOL = _obj(
    {
        "type": st.sampled_from(
            [
                "web_search",
                "file_search",
                "image_generation",
                "local_shell",
                "shell",
                "apply_patch",
                "mcp",
                "computer_use_preview",
            ]
        )
    },
    {
        "server_label": SAFE_TEXT,
        "vector_store_ids": st.lists(SAFE_TEXT, max_size=2),
        "environment": st.one_of(
            _obj({"type": st.sampled_from(["local", "container_auto"])}), JSON_ANY
        ),
    },
)
TOOL_SEARCH = _obj(
    {"type": st.just("tool_search")}, {"execution": st.sampled_from(["client", "server"])}
)
TOOL = st.one_of(
    FUNCTION_TOOL, FUNCTION_TOOL, CUSTOM_TOOL, NAMESPACE_TOOL, NAMESPACE_TOOL, HOSTED_TOOL,
    TOOL_SEARCH, JSON_ANY,
)  # fmt: skip
TOOLS = st.lists(TOOL, max_size=8)
TOOL_CHOICE = st.one_of(
    st.sampled_from(["auto", "none", "required"]),
    _obj({"type": st.just("function"), "name": NAMES}, {"namespace": NAMES}),
    _obj({"type": st.just("custom"), "name": NAMES}),
    _obj({"type": st.sampled_from(["shell", "apply_patch", "local_shell", "web_search"])}),
    _obj(
        {
            "type": st.just("allowed_tools"),
            "mode": st.sampled_from(["auto", "required"]),
            "tools": st.lists(_obj({"type": st.just("function"), "name": NAMES}), max_size=3),
        }
    ),
    JSON_ANY,
)

TEXT_PART = _obj(
    {"type": st.sampled_from(["input_text", "output_text", "text"]), "text": _sometimes(SAFE_TEXT)}
)
IMAGE_PART = _obj(
    {"type": st.just("input_image")},
    {
        "image_url": _sometimes(st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "https://example.com/a.png"])),
        "file_id": _sometimes(st.just("file_123")),
        "detail": st.sampled_from(["auto", "low", "high", "original"]),
    },
)  # fmt: skip
FILE_PART = _obj(
    {"type": st.just("input_file")},
    {"file_data": _sometimes(st.just("data:text/plain;base64,aGk=")), "filename": _sometimes(SAFE_TEXT),
     "file_url": st.just("https://example.com/a.pdf"), "file_id": st.just("file_1")},
)  # fmt: skip
REFUSAL_PART = _obj({"type": st.just("refusal"), "refusal": _sometimes(SAFE_TEXT)})
PART = st.one_of(TEXT_PART, TEXT_PART, IMAGE_PART, FILE_PART, REFUSAL_PART, JSON_ANY)
ROLES = st.sampled_from(["user", "assistant", "system", "developer"]) | JSON_ANY
MESSAGE = _obj(
    {"role": ROLES, "content": SAFE_TEXT | st.lists(PART, max_size=3) | JSON_ANY},
    {"type": st.just("message"), "id": st.just("msg_1"), "status": st.just("completed")},
)
FUNCTION_CALL = _obj(
    {"type": st.just("function_call"), "call_id": CALL_IDS, "name": NAMES},
    {"arguments": _sometimes(st.sampled_from(["{}", '{"q":"x"}', "not json"])), "namespace": OPTIONAL_NAMES},
)  # fmt: skip
CUSTOM_CALL = _obj(
    {"type": st.just("custom_tool_call"), "call_id": CALL_IDS, "name": NAMES},
    {"input": _sometimes(SAFE_TEXT), "namespace": OPTIONAL_NAMES},
)
CALL_OUTPUT = _obj(
    {
        "type": st.sampled_from(["function_call_output", "custom_tool_call_output"]),
        "call_id": CALL_IDS,
        "output": SAFE_TEXT | st.lists(PART, max_size=2) | JSON_ANY,
    }
)
REASONING = _obj(
    {"type": st.just("reasoning")},
    {
        "id": st.just("rs_1"),
        "summary": st.lists(_obj({"type": st.just("summary_text"), "text": SAFE_TEXT}), max_size=2) | JSON_ANY,
        "content": st.lists(_obj({"type": st.just("reasoning_text"), "text": SAFE_TEXT}), max_size=2) | JSON_ANY,
        "encrypted_content": SAFE_TEXT | JSON_ANY,
    },
)  # fmt: skip
SEARCH_CALL = _obj(
    {"type": st.just("tool_search_call")},
    {"call_id": CALL_IDS | st.none(), "arguments": _sometimes(st.just({"query": "docs"})),
     "execution": st.just("client"), "status": st.just("completed")},
)  # fmt: skip
SEARCH_OUTPUT = _obj(
    {"type": st.just("tool_search_output")},
    {"call_id": CALL_IDS | st.none(), "tools": _sometimes(TOOLS), "execution": st.just("client")},
)
ADDITIONAL_TOOLS = _obj({"type": st.just("additional_tools"), "tools": _sometimes(TOOLS)})
SHELL_ITEM = st.one_of(
    _obj({"type": st.just("shell_call"), "call_id": CALL_IDS},
         {"action": _obj({"commands": st.lists(SAFE_TEXT, max_size=2) | JSON_ANY},
                         {"timeout_ms": st.integers() | JSON_ANY}) | JSON_ANY}),
    _obj({"type": st.just("shell_call_output"), "call_id": CALL_IDS},
         {"output": st.lists(_obj({}, {"stdout": SAFE_TEXT | JSON_ANY, "outcome": JSON_ANY}),
                             max_size=2) | JSON_ANY}),
    _obj({"type": st.just("apply_patch_call"), "call_id": CALL_IDS},
         {"operation": _obj({"type": st.sampled_from(["create_file", "delete_file", "x"]),
                             "path": SAFE_TEXT | JSON_ANY}, {"diff": SAFE_TEXT | JSON_ANY})
          | JSON_ANY, "status": st.just("completed")}),
    _obj({"type": st.just("apply_patch_call_output"), "call_id": CALL_IDS},
         {"status": st.sampled_from(["completed", "failed"]), "output": SAFE_TEXT | JSON_ANY}),
)  # fmt: skip
OTHER_ITEM = st.one_of(
    _obj({"type": st.just("item_reference"), "id": SAFE_TEXT}),
    _obj({"id": SAFE_TEXT}),
    _obj({"type": st.just("compaction"), "encrypted_content": SAFE_TEXT}),
    _obj({"type": SAFE_TEXT}, {"payload": JSON_ANY}),
)
ITEM = st.one_of(
    MESSAGE, MESSAGE, FUNCTION_CALL, CUSTOM_CALL, CALL_OUTPUT, REASONING, SEARCH_CALL,
    SEARCH_OUTPUT, ADDITIONAL_TOOLS, SHELL_ITEM, OTHER_ITEM, JSON_ANY,
)  # fmt: skip
ITEMS = st.lists(ITEM, max_size=8)
TEXT_CONFIG = st.sampled_from(
    [
        {"format": {"type": "text"}},
        {"format": {"type": "json_object"}},
        {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        {"verbosity": "low"},
    ]
)
REASONING_CONFIG = _obj(
    {}, {"effort": st.sampled_from(["minimal", "low", "medium", "high"]), "summary": st.sampled_from(["auto", "detailed"])}
)  # fmt: skip


def _rarely() -> st.SearchStrategy[bool]:
    return st.integers(0, 9).map(lambda n: n == 6)  # 6: not a value hypothesis favours


@st.composite
def plausible_request(draw: st.DrawFn, *, background: bool = True) -> dict[str, Any]:
    """A request shaped like a real client's: real tool shapes, namespaces and items."""
    body: dict[str, Any] = {"model": draw(st.sampled_from(["m", "gpt-5-codex", "qwen3"]))}
    body["input"] = draw(SAFE_TEXT | ITEMS)
    if draw(st.booleans()):
        body["tools"] = draw(TOOLS)
    optional: dict[str, st.SearchStrategy[Any]] = {
        "tool_choice": TOOL_CHOICE,
        "instructions": SAFE_TEXT,
        "stream": st.booleans(),
        "store": st.booleans(),
        "parallel_tool_calls": st.booleans(),
        "max_output_tokens": st.integers(16, 4096),  # OpenAI refuses fewer
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "text": TEXT_CONFIG,
        "reasoning": REASONING_CONFIG,
        "metadata": st.dictionaries(st.text(max_size=8), SAFE_TEXT, max_size=3),
        "include": st.lists(st.sampled_from(["reasoning.encrypted_content", "message.output_text.logprobs"]), max_size=2),
        "prompt_cache_key": SAFE_TEXT,
        "user": SAFE_TEXT,
        "truncation": st.sampled_from(["auto", "disabled"]),
    }  # fmt: skip
    for key, strategy in optional.items():
        if draw(st.booleans()):
            body[key] = draw(strategy)
    if draw(_rarely()):
        body["previous_response_id"] = draw(SAFE_TEXT)
    if background and draw(_rarely()):
        body["background"] = True
    return body


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


@st.composite
def mutated_request(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible request with one value anywhere in it replaced by arbitrary JSON."""
    # a copy: sampled_from hands out the same dicts every time, and they must not change
    body = copy.deepcopy(draw(plausible_request(background=False)))
    path = draw(st.sampled_from(_paths(body)[1:]))
    target: Any = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = draw(JSON_ANY)
    return body


KNOWN_KEYS = st.sampled_from(
    ["model", "input", "tools", "tool_choice", "stream", "store", "instructions", "text",
     "reasoning", "metadata", "previous_response_id", "max_output_tokens", "temperature",
     "top_p", "parallel_tool_calls", "include", "conversation", "prompt"]
)  # fmt: skip
GARBAGE_OBJECT = st.dictionaries(KNOWN_KEYS | st.text(max_size=8), JSON_ANY, max_size=6)


def _encode(value: Any) -> bytes:
    # the stdlib encoder, so integers beyond 64 bits and NaN go out as a careless client's would
    return json.dumps(value).encode()


GARBAGE_BODY = st.one_of(
    st.binary(max_size=200),
    JSON_ANY.map(_encode),
    GARBAGE_OBJECT.map(_encode),
    GARBAGE_OBJECT.map(lambda d: _encode({**d, "model": "m"})),
    st.sampled_from([b"", b"{", b"[]", b"null", b'{"model": "m", "input": "x"', b"\xff\xfe{}", b'{"a":1}{"b":2}']),
)  # fmt: skip

# -- the gateway under test ---------------------------------------------------------------


class _ErrorLog(logging.Handler):
    """Collects every error-level record (an unhandled exception logs one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        lines = [f"{r.name}: {r.getMessage()}" for r in self.records]
        self.records.clear()
        return lines


def _responder(body: Any) -> list[Any]:
    """Answer with a call to one of the flat tools offered when there are any, else text."""
    tools = body.get("tools") if isinstance(body, dict) else None
    messages = body.get("messages") if isinstance(body, dict) else None
    if tools and len(messages or ()) % 2 == 0:
        name = tools[len(messages or ()) % len(tools)]["function"]["name"]
        calls = tool_call_chunks(0, "call_fz", [name[:3], name[3:]], ['{"input":', '"x"}'])
        return [*calls, finish("tool_calls"), usage(5, 2), DONE]
    return [*text_chunks(["Hel", "lo"]), finish("stop"), usage(5, 2), DONE]


@dataclass
class Fuzz:
    gw: GatewayHarness
    session: aiohttp.ClientSession
    errors: _ErrorLog
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fuzz() -> AsyncIterator[Fuzz]:
    errors = _ErrorLog()
    logging.getLogger().addHandler(errors)
    try:
        async with GatewayHarness(**LIMITS) as gw:
            gw.backend.responder = _responder
            async with aiohttp.ClientSession() as session:
                state = Fuzz(gw, session, errors)
                yield state
                print(f"\nfuzz outcomes: {state.counts}")
    finally:
        logging.getLogger().removeHandler(errors)


# -- checks -------------------------------------------------------------------------------


def _parsed(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def check_error(body: Any, status: int, sent: Any) -> dict[str, Any]:
    """OpenAI's error shape; a `param` whenever the request was a JSON object."""
    assert 400 <= status < 500, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert "Traceback" not in error["message"], error
    assert error["type"] == "invalid_request_error", error
    assert error["param"] is None or isinstance(error["param"], str), error
    if isinstance(sent, dict) and status == 400:
        assert error["param"], ("a field is at fault: name it", error, sent)
    return error


def declared_identities(request: dict[str, Any]) -> set[tuple[str | None, str]]:
    """(namespace, name) of every function/custom tool the request declares."""
    out: set[tuple[str | None, str]] = set()
    lists = [request.get("tools") or []]
    items = request.get("input")
    if isinstance(items, list):
        lists += [
            i.get("tools") or []
            for i in items
            if isinstance(i, dict) and i.get("type") in ("additional_tools", "tool_search_output")
        ]
    for tools in lists:
        for tool in tools:
            if tool.get("type") in ("function", "custom"):
                out.add((None, tool["name"]))
            elif tool.get("type") == "namespace":
                out |= {(tool["name"], m["name"]) for m in tool["tools"]}
    return out


def check_backend_saw_flat_tools(fuzz: Fuzz, before: int, request: dict[str, Any]) -> None:
    """The backend only ever sees flat function tools with legal names."""
    for chat in fuzz.gw.backend.requests[before:]:
        for tool in chat.get("tools") or []:
            assert set(tool) == {"type", "function"} and tool["type"] == "function", tool
            assert LEGAL_FLAT.fullmatch(tool["function"]["name"]), tool
        assert len(chat.get("tools") or []) <= LIMITS["max_tools"]


def check_output(response: dict[str, Any], request: dict[str, Any]) -> None:
    """Every call comes back under an identity the request declared."""
    declared = declared_identities(request)
    for item in response["output"]:
        if item["type"] in ("function_call", "custom_tool_call"):
            assert (item.get("namespace"), item["name"]) in declared, (item, declared)


def _without_tools(response: dict[str, Any]) -> dict[str, Any]:
    """The Response as the SDK's models can judge it.

    `tools` echo the client's declarations as sent; the enum-like strings (reasoning
    effort and summary, verbosity, service tier) pass through unchecked on purpose,
    so that values newer than the SDK keep working: both are checked for type only.
    """
    reasoning, text = response["reasoning"], response["text"]
    assert all(v is None or isinstance(v, str) for v in reasoning.values()), reasoning
    assert isinstance(text["verbosity"], str) and isinstance(response["service_tier"], str)
    return {
        **response,
        "tools": [],
        "reasoning": {"effort": None, "summary": None},
        "text": {**text, "verbosity": "medium"},
        "service_tier": "default",
    }


def check_stream(events: list[dict[str, Any]], request: dict[str, Any]) -> None:
    assert events, "an empty stream"
    for n, event in enumerate(events):
        if "response" in event:
            event = {**event, "response": _without_tools(event["response"])}
        validate_event(event)
        assert event["sequence_number"] == n
    first = 1 if events[0]["type"] == "response.queued" and request.get("background") else 0
    assert events[first]["type"] == "response.created", events[:2]
    assert events[-1]["type"] == "response.completed", events[-1]
    assert all(e["type"] not in TERMINAL for e in events[:-1])
    check_output(events[-1]["response"], request)


async def post(
    fuzz: Fuzz, raw: bytes, request: Any, content_type: str = "application/json"
) -> None:
    """POST one body; check the answer is a valid response or a well-formed 4xx."""
    before = len(fuzz.gw.backend.requests)
    async with fuzz.session.post(
        fuzz.gw.url + "/responses", data=raw, headers={"Content-Type": content_type}
    ) as resp:
        payload = await resp.read()  # a dropped connection raises here
        status = resp.status
        assert resp.headers.get("X-Request-Id"), "every answer carries a request id"
        ctype = resp.content_type
    assert fuzz.errors.take() == [], "no error-level log line (no traceback)"
    sent = _parsed(raw)
    if status >= 400:
        assert ctype == "application/json", (status, payload[:300])
        error = check_error(_parsed(payload), status, sent)
        fuzz.count(f"{status} {error['param'] and error['param'].split('[')[0].split('.')[0]}")
        return
    assert status == 200, (status, payload[:300])
    assert isinstance(sent, dict)
    check_backend_saw_flat_tools(fuzz, before, sent)
    if ctype == "text/event-stream":
        check_stream(parse_sse(payload), sent)
        fuzz.count("200 sse")
        return
    response = orjson.loads(payload)
    validate_response(_without_tools(response))
    if sent.get("background"):
        assert response["status"] in ("queued", "in_progress", "completed"), response["status"]
        fuzz.count("200 background")
        return
    assert response["status"] == "completed", response
    check_output(response, sent)
    fuzz.count("200 json")


# -- HTTP ---------------------------------------------------------------------------------


async def _plausible(fuzz: Fuzz, body: dict[str, Any]) -> None:
    await post(fuzz, _encode(body), body)


@CI
@given(body=plausible_request())
async def test_fuzz_plausible_requests(fuzz: Fuzz, body: dict[str, Any]) -> None:
    await _plausible(fuzz, body)


@pytest.mark.slow
@LONG
@given(body=plausible_request())
async def test_fuzz_plausible_requests_long(fuzz: Fuzz, body: dict[str, Any]) -> None:
    await _plausible(fuzz, body)


@CI
@given(body=mutated_request())
async def test_fuzz_mutated_requests(fuzz: Fuzz, body: dict[str, Any]) -> None:
    await _plausible(fuzz, body)


@pytest.mark.slow
@LONG
@given(body=mutated_request())
async def test_fuzz_mutated_requests_long(fuzz: Fuzz, body: dict[str, Any]) -> None:
    await _plausible(fuzz, body)


async def _tools(fuzz: Fuzz, tools: Any, choice: Any, items: list[Any]) -> None:
    body: dict[str, Any] = {"model": "m", "input": [*items, {"role": "user", "content": "go"}]}
    body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    await post(fuzz, _encode(body), body)


TOOL_LISTS = st.lists(TOOL, max_size=30) | JSON_ANY
TOOL_ITEMS = st.lists(SEARCH_OUTPUT | ADDITIONAL_TOOLS | FUNCTION_CALL, max_size=3)


@CI
@given(tools=TOOL_LISTS, choice=st.none() | TOOL_CHOICE, items=TOOL_ITEMS)
async def test_fuzz_tool_lists(fuzz: Fuzz, tools: Any, choice: Any, items: list[Any]) -> None:
    await _tools(fuzz, tools, choice, items)


@pytest.mark.slow
@LONG
@given(tools=TOOL_LISTS, choice=st.none() | TOOL_CHOICE, items=TOOL_ITEMS)
async def test_fuzz_tool_lists_long(fuzz: Fuzz, tools: Any, choice: Any, items: list[Any]) -> None:
    await _tools(fuzz, tools, choice, items)


INPUTS = st.lists(ITEM, max_size=30) | JSON_ANY


@CI
@given(items=INPUTS, stream=st.booleans())
async def test_fuzz_input_items(fuzz: Fuzz, items: Any, stream: bool) -> None:
    body = {"model": "m", "input": items, "stream": stream}
    await post(fuzz, _encode(body), body)


@pytest.mark.slow
@LONG
@given(items=INPUTS, stream=st.booleans())
async def test_fuzz_input_items_long(fuzz: Fuzz, items: Any, stream: bool) -> None:
    body = {"model": "m", "input": items, "stream": stream}
    await post(fuzz, _encode(body), body)


CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", ""])


@CI
@given(raw=GARBAGE_BODY, ctype=CONTENT_TYPES)
async def test_fuzz_garbage_bodies(fuzz: Fuzz, raw: bytes, ctype: str) -> None:
    await post(fuzz, raw, _parsed(raw), ctype)


@pytest.mark.slow
@LONG
@given(raw=GARBAGE_BODY, ctype=CONTENT_TYPES)
async def test_fuzz_garbage_bodies_long(fuzz: Fuzz, raw: bytes, ctype: str) -> None:
    await post(fuzz, raw, _parsed(raw), ctype)


# -- WebSocket ----------------------------------------------------------------------------

LANES = st.none() | st.sampled_from(["a", "lane-2", "x" * 257, "bad lane!", ""]) | JSON_ANY


@st.composite
def ws_frame(draw: st.DrawFn) -> str | bytes:
    """One client message: a plausible or broken create, another event, or garbage."""
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        frame: Any = {"type": "response.create", **draw(plausible_request(background=False))}
        if draw(st.booleans()):
            frame["stream_id"] = draw(LANES)
        if draw(_rarely()):
            frame["generate"] = draw(st.booleans() | JSON_ANY)
    elif kind <= 6:
        frame = {"type": "response.create", **draw(mutated_request())}
    elif kind == 7:
        frame = draw(GARBAGE_OBJECT | JSON_ANY)
        if isinstance(frame, dict) and draw(st.booleans()):
            frame["type"] = draw(
                st.sampled_from(["response.cancel", "session.update", "", "response.create"])
                | JSON_ANY
            )
    elif kind == 8:
        return draw(st.text(st.characters(codec="utf-8"), max_size=40))
    else:
        return draw(st.binary(max_size=60))
    return json.dumps(frame)


async def _ws_frames(fuzz: Fuzz, frames: list[str | bytes]) -> None:
    async with fuzz.session.ws_connect(fuzz.gw.ws_url) as ws:
        for raw in frames:
            if isinstance(raw, bytes):
                await ws.send_bytes(raw)
            else:
                await ws.send_str(raw)
            sent = _parsed(raw.encode() if isinstance(raw, str) else raw)
            events: list[dict[str, Any]] = []
            while True:
                msg = await ws.receive(timeout=10)
                assert msg.type == aiohttp.WSMsgType.TEXT, (msg, "the socket must stay open")
                event = orjson.loads(msg.data)
                events.append(event)
                if event["type"] in TERMINAL:
                    break
            assert fuzz.errors.take() == [], "no error-level log line (no traceback)"
            last = events[-1]
            if last["type"] == "error":
                assert len(events) == 1, events
                status = last.pop("status")
                last.pop("type")
                last.pop("stream_id", None)
                error = check_error(last, status, sent)
                fuzz.count(
                    f"ws {status} {error['param'] and error['param'].split('[')[0].split('.')[0]}"
                )
                continue
            assert isinstance(sent, dict)
            lane = sent.get("stream_id")
            for event in events:
                assert event.pop("stream_id", None) == lane
            if sent.get("generate") is False:
                assert [e["type"] for e in events] == ["response.created", "response.completed"]
            else:
                check_stream(events, sent)
            fuzz.count("ws response")
        assert not ws.closed


@CI
@given(frames=st.lists(ws_frame(), min_size=1, max_size=3))
async def test_fuzz_websocket_frames(fuzz: Fuzz, frames: list[str | bytes]) -> None:
    await _ws_frames(fuzz, frames)


@pytest.mark.slow
@LONG
@given(frames=st.lists(ws_frame(), min_size=1, max_size=3))
async def test_fuzz_websocket_frames_long(fuzz: Fuzz, frames: list[str | bytes]) -> None:
    await _ws_frames(fuzz, frames)
