"""The load backend's `/v1/responses` side: a stream of Responses events, built once and cached.

What a backend that serves the Responses API natively (vLLM, llama.cpp, OpenAI) streams for
one turn: `response.created`, `response.in_progress`, a message item with N
`response.output_text.delta` events, then a function call on the **first** tool of the request
with M `response.function_call_arguments.delta` fragments, then `response.completed` with the
whole output and usage. Each event is `event: <type>` + `data: <json>`, one HTTP chunk per
event, as the real servers send them.

The call is named after what the request's first tool is: a function tool (a gateway that
flattened the namespace, e.g. `mcp__bench__lookup` or agentic-api's
`agentic_ns__mcp__bench__lookup`) is called by that flat name; a namespace tool (passed
natively) is called as its first function, with `namespace` set, as OpenAI does.
"""

from __future__ import annotations

from typing import Any

import orjson
from httpwire import LAST_CHUNK, chunk, simple_response

CREATED = 1_700_000_000
TEXT_MARK = "tok"
RESP_ID, MSG_ID, FC_ID, CALL_ID = "resp_bench", "msg_bench", "fc_bench", "call_bench0"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def argument_fragments(m: int) -> list[str]:
    """M pieces that join into one valid JSON object (the same as the Chat side's)."""
    if m <= 1:
        return ['{"query":"bench"}']
    if m == 2:
        return ['{"query":"', 'bench"}']
    return ['{"query":"', *("abcd" for _ in range(m - 2)), '"}']


def first_tool(body: dict[str, Any]) -> tuple[str, str | None]:
    """(name, namespace) the backend calls: the request's first tool, flat or native."""
    tools = body.get("tools") or []
    first = tools[0] if tools and isinstance(tools[0], dict) else {}
    if first.get("type") == "namespace":
        inner = [t for t in first.get("tools") or [] if isinstance(t, dict)]
        name = str(inner[0].get("name") or "lookup") if inner else "lookup"
        return name, str(first.get("name") or "")
    fn = first.get("function")  # a Chat-shaped tool sent here by mistake still gets a call
    if isinstance(fn, dict) and fn.get("name"):
        return str(fn["name"]), None
    return str(first.get("name") or "lookup"), None


def _items(n: int, m: int, name: str, namespace: str | None) -> tuple[dict[str, Any], ...]:
    text = "".join(f"{TEXT_MARK}{i} " for i in range(n))
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    message = {"id": MSG_ID, "type": "message", "status": "completed", "role": "assistant"}
    message["content"] = [part]
    call: dict[str, Any] = {"id": FC_ID, "type": "function_call", "status": "completed"}
    call |= {"call_id": CALL_ID, "name": name, "arguments": "".join(argument_fragments(m))}
    if namespace is not None:
        call["namespace"] = namespace
    return message, call


def _response(status: str, output: list[dict[str, Any]], n: int, m: int) -> dict[str, Any]:
    out: dict[str, Any] = {"id": RESP_ID, "object": "response", "created_at": CREATED}
    out |= {"status": status, "model": "bench", "output": output, "error": None}
    out |= {"incomplete_details": None, "parallel_tool_calls": True, "tools": []}
    if status == "completed":
        usage = {"input_tokens": 24, "output_tokens": n + m, "total_tokens": 24 + n + m}
        out["usage"] = usage | {
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return out


def responses_events(n: int, m: int, name: str, namespace: str | None) -> list[dict[str, Any]]:
    """The event objects of one streamed turn, `sequence_number` in order."""
    message, call = _items(n, m, name, namespace)
    text_at = {"item_id": MSG_ID, "output_index": 0, "content_index": 0}
    call_at = {"item_id": FC_ID, "output_index": 1}
    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response("in_progress", [], n, m)},
        {"type": "response.in_progress", "response": _response("in_progress", [], n, m)},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **text_at, "part": empty_part},
    ]
    events += [
        {
            "type": "response.output_text.delta",
            **text_at,
            "delta": f"{TEXT_MARK}{i} ",
            "logprobs": [],
        }
        for i in range(n)
    ]
    part = message["content"][0]
    events += [
        {"type": "response.output_text.done", **text_at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **text_at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**call, "status": "in_progress", "arguments": ""},
        },
    ]
    events += [
        {"type": "response.function_call_arguments.delta", **call_at, "delta": a}
        for a in argument_fragments(m)
    ]
    events += [
        {
            "type": "response.function_call_arguments.done",
            **call_at,
            "arguments": call["arguments"],
        },
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {"type": "response.completed", "response": _response("completed", [message, call], n, m)},
    ]
    return [{**e, "sequence_number": i} for i, e in enumerate(events)]


def encode_stream(n: int, m: int, name: str, namespace: str | None) -> bytes:
    """The whole HTTP response: head, one chunk per SSE event (`event:` + `data:`), last chunk."""
    out = [STREAM_HEAD]
    for e in responses_events(n, m, name, namespace):
        out.append(chunk(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"))
    out.append(LAST_CHUNK)
    return b"".join(out)


def encode_json(n: int, m: int, name: str, namespace: str | None) -> bytes:
    """A non-streamed request: the completed Response as one JSON body."""
    return simple_response(
        200, orjson.dumps(_response("completed", list(_items(n, m, name, namespace)), n, m))
    )
