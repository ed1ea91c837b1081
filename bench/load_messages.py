"""The load backend's `/v1/messages` side: an Anthropic Messages stream, built once and cached.

What a backend that serves the Messages API (Anthropic, llama.cpp, vLLM, LiteLLM) streams for
one turn, in the documented events: `message_start`, a text block with N `text_delta`s, then
a `tool_use` block on the **first** tool of the request (by the name it was given: the
gateway's flat name) with M `input_json_delta` fragments, `message_delta` (stop reason
`tool_use`, the usage) and `message_stop`. Each event is `event: <type>` + `data: <json>`,
one HTTP chunk per event, as the real servers send them.
"""

from __future__ import annotations

from typing import Any

import orjson
from httpwire import LAST_CHUNK, chunk, simple_response

TEXT_MARK = "tok"
CALL_ID = "toolu_bench0"
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


def first_tool(body: dict[str, Any]) -> str:
    tools = body.get("tools") or []
    first = tools[0] if tools and isinstance(tools[0], dict) else {}
    return str(first.get("name") or "lookup")


def _usage(n: int, m: int) -> dict[str, int]:
    return {"input_tokens": 24, "output_tokens": n + m}


def message_events(n: int, m: int, name: str) -> list[dict[str, Any]]:
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "content": [],
               "model": "bench", "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 24, "output_tokens": 1}}  # fmt: skip
    out: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    out.append(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    )
    out += [
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": f"{TEXT_MARK}{i} "}}
        for i in range(n)
    ]  # fmt: skip
    out.append({"type": "content_block_stop", "index": 0})
    use = {"type": "tool_use", "id": CALL_ID, "name": name, "input": {}}
    out.append({"type": "content_block_start", "index": 1, "content_block": use})
    out += [
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": piece}}
        for piece in argument_fragments(m)
    ]  # fmt: skip
    out.append({"type": "content_block_stop", "index": 1})
    delta = {"stop_reason": "tool_use", "stop_sequence": None}
    out.append({"type": "message_delta", "delta": delta, "usage": _usage(n, m)})
    out.append({"type": "message_stop"})
    return out


def encode_stream(n: int, m: int, name: str) -> bytes:
    """The whole HTTP response: head, one chunk per event, the last chunk."""
    events = [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in message_events(n, m, name)
    ]
    return STREAM_HEAD + b"".join(chunk(e) for e in events) + LAST_CHUNK


def encode_json(n: int, m: int, name: str) -> bytes:
    content = [
        {"type": "text", "text": "".join(f"{TEXT_MARK}{i} " for i in range(n))},
        {"type": "tool_use", "id": CALL_ID, "name": name,
         "input": orjson.loads("".join(argument_fragments(m)))},
    ]  # fmt: skip
    body = {"id": "msg_bench", "type": "message", "role": "assistant", "content": content,
            "model": "bench", "stop_reason": "tool_use", "stop_sequence": None,
            "usage": _usage(n, m)}  # fmt: skip
    return simple_response(200, orjson.dumps(body))
