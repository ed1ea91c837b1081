"""A Chat Completions backend that is never the bottleneck.

`POST /v1/chat/completions` answers with a stream built once per (N, M, tool name) and cached:
a role chunk, N text deltas, one tool call on the first tool of the request (its flat name,
whatever the gateway made of it) with M argument fragments, the finish chunk, a usage chunk and
`data: [DONE]`. Each SSE event is one HTTP chunk, as real servers send them, and the whole
response is handed to the socket in one write, so it goes out as fast as the peer reads.

`POST /v1/responses` (any path ending in `/responses`) streams the same turn as Responses
events instead (`load_responses.py`): N `response.output_text.delta`, a function call with M
argument fragments, `response.completed`; the backend for `--upstream-api responses` and
for agentic-api.

`POST /v1/messages` (any path ending in `/messages`) streams it as Anthropic Messages events
(`load_messages.py`): N `text_delta`, a `tool_use` block with M `input_json_delta` fragments,
`message_stop`; the backend for `--upstream-api anthropic`.

`POST /control {"n": .., "m": ..}` changes N and M for the following requests; `GET /last`
returns the path and body of the last model request (what a gateway made of the tools); `GET /v1/models`
and `GET /healthz` answer for readiness checks. Non-streaming requests get the same content as
one JSON body.

    python bench/load_backend.py --port 0 --n 200 --m 50   # prints "listening <port>"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import load_messages
import load_responses
import orjson
from httpwire import (
    LAST_CHUNK,
    BadRequest,
    Request,
    chunk,
    install_uvloop,
    set_nodelay,
    simple_response,
    take_request,
)

CREATED = 1_700_000_000
CALL_ID = b"call_bench0"  # the call's id in every answer (11 bytes: see --unique-calls)
UNIQUE_IDS = ((b"resp_bench", b"resp_%05d"), (b"msg_bench", b"msg_%05d"), (b"fc_bench", b"fc_%05d"))
TEXT_MARK = "tok"  # every text delta starts with it; the load client looks for it in the relay
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def argument_fragments(m: int) -> list[str]:
    """M pieces that join into one valid JSON object."""
    if m <= 1:
        return ['{"query":"bench"}']
    if m == 2:
        return ['{"query":"', 'bench"}']
    return ['{"query":"', *("abcd" for _ in range(m - 2)), '"}']


def chat_chunks(n: int, m: int, tool_name: str, model: str = "bench") -> list[dict[str, Any]]:
    """The chunk objects of one streamed completion (without the `[DONE]` sentinel)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED}
    base["model"] = model

    def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [c]}

    out = [choice({"role": "assistant", "content": ""})]
    out += [choice({"content": f"{TEXT_MARK}{i} "}) for i in range(n)]
    frags = argument_fragments(m)
    call = {"index": 0, "id": "call_bench0", "type": "function"}
    out.append(choice({"tool_calls": [{**call, "function": {"name": tool_name, "arguments": ""}}]}))
    out += [choice({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in frags]
    out.append(choice({}, "tool_calls"))
    usage = {"prompt_tokens": 24, "completion_tokens": n + m, "total_tokens": 24 + n + m}
    out.append({**base, "choices": [], "usage": usage})
    return out


def encode_stream(n: int, m: int, tool_name: str) -> bytes:
    """The whole HTTP response: head, one chunk per SSE event, the last chunk."""
    events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chat_chunks(n, m, tool_name)]
    events.append(b"data: [DONE]\n\n")
    return STREAM_HEAD + b"".join(chunk(e) for e in events) + LAST_CHUNK


def encode_json(n: int, m: int, tool_name: str) -> bytes:
    text = "".join(f"{TEXT_MARK}{i} " for i in range(n))
    call = {
        "id": "call_bench0",
        "type": "function",
        "function": {"name": tool_name, "arguments": "".join(argument_fragments(m))},
    }
    message = {"role": "assistant", "content": text, "tool_calls": [call]}
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": CREATED,
        "model": "bench",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 24, "completion_tokens": n + m, "total_tokens": 24 + n + m},
    }
    return simple_response(200, orjson.dumps(body))


def first_tool_name(body: dict[str, Any]) -> str:
    tools = body.get("tools") or []
    if not tools or not isinstance(tools[0], dict):
        return "lookup"
    first = tools[0]
    fn = first.get("function")
    if isinstance(fn, dict) and fn.get("name"):
        return str(fn["name"])
    return str(first.get("name") or "lookup")


class Backend:
    """Shared state: the current N and M and the cache of encoded responses."""

    def __init__(self, n: int = 200, m: int = 50, unique_calls: bool = False) -> None:
        self.n = n
        self.m = m
        self.unique_calls = unique_calls  # each answer's call its own id (bench_history.py)
        self.answers = 0
        self.requests = 0
        self.responses_requests = 0
        self.last: dict[str, Any] = {}  # what the last model request asked for (GET /last)
        self._cache: dict[tuple[int, int, str, bool], bytes] = {}
        self._rcache: dict[tuple[int, int, str, str | None, bool], bytes] = {}
        self._mcache: dict[tuple[int, int, str, bool], bytes] = {}

    def respond_responses(self, req: Request) -> bytes:
        """`POST .../responses`: the turn as Responses events (or one JSON Response)."""
        self.responses_requests += 1
        body = orjson.loads(req.body) if req.body else {}
        self.last = {"path": req.path.decode(errors="replace"), "body": body}
        name, namespace = load_responses.first_tool(body)
        key = (self.n, self.m, name, namespace, body.get("stream", False) is True)
        cached = self._rcache.get(key)
        if cached is None:
            encode = load_responses.encode_stream if key[4] else load_responses.encode_json
            cached = self._rcache[key] = encode(self.n, self.m, name, namespace)
        return cached

    def respond_messages(self, req: Request) -> bytes:
        """`POST .../messages`: the turn as Anthropic Messages events (or one JSON Message)."""
        body = orjson.loads(req.body) if req.body else {}
        self.last = {"path": req.path.decode(errors="replace"), "body": body}
        key = (self.n, self.m, load_messages.first_tool(body), body.get("stream", False) is True)
        cached = self._mcache.get(key)
        if cached is None:
            encode = load_messages.encode_stream if key[3] else load_messages.encode_json
            cached = self._mcache[key] = encode(key[0], key[1], key[2])
        return cached

    def respond(self, req: Request) -> bytes:
        out = self._respond(req)
        if self.unique_calls and CALL_ID in out:  # the same lengths: the framing holds
            self.answers += 1
            n = self.answers % 100_000
            out = out.replace(CALL_ID, b"call_%06d" % n)
            for old, new in UNIQUE_IDS:  # the items of a Responses stream (stores key them)
                out = out.replace(old, new % n)
        return out

    def _respond(self, req: Request) -> bytes:
        path = req.path.split(b"?", 1)[0]
        if req.method == b"POST" and path.endswith(b"/chat/completions"):
            self.requests += 1
            body = orjson.loads(req.body) if req.body else {}
            self.last = {"path": req.path.decode(errors="replace"), "body": body}
            key = (self.n, self.m, first_tool_name(body), body.get("stream", False) is True)
            cached = self._cache.get(key)
            if cached is None:
                encode = encode_stream if key[3] else encode_json
                cached = self._cache[key] = encode(key[0], key[1], key[2])
            return cached
        if req.method == b"POST" and path.endswith(b"/responses"):
            return self.respond_responses(req)
        if req.method == b"POST" and path.endswith(b"/messages"):
            return self.respond_messages(req)
        if req.method == b"POST" and path == b"/control":
            body = orjson.loads(req.body) if req.body else {}
            self.n = int(body.get("n", self.n))
            self.m = int(body.get("m", self.m))
            return simple_response(200, orjson.dumps({"n": self.n, "m": self.m}))
        if req.method == b"GET" and path == b"/last":
            return simple_response(200, orjson.dumps(self.last))
        if req.method == b"GET" and path.endswith(b"/models"):
            models = {"object": "list", "data": [{"id": "bench", "object": "model"}]}
            return simple_response(200, orjson.dumps(models))
        if req.method == b"GET" and path in (b"/healthz", b"/health"):
            return simple_response(200, b'{"ok":true}')
        return simple_response(404, b'{"error":{"message":"not found"}}')


class BackendProtocol(asyncio.Protocol):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buf += data
        while True:
            try:
                req = take_request(self.buf)
            except (BadRequest, orjson.JSONDecodeError):
                self.transport.write(simple_response(400, b'{"error":{"message":"bad"}}'))
                self.transport.close()
                return
            if req is None:
                return
            try:
                out = self.backend.respond(req)
            except (ValueError, TypeError):
                out = simple_response(400, b'{"error":{"message":"bad request body"}}')
            self.transport.write(out)
            if not req.keep_alive:
                self.transport.close()
                return


async def start(backend: Backend, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: BackendProtocol(backend), host, port, backlog=1024)


async def _main(args: argparse.Namespace) -> None:
    server = await start(Backend(args.n, args.m, args.unique_calls), args.host, args.port)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8900)
    p.add_argument("--n", type=int, default=200, help="text deltas per response")
    p.add_argument("--m", type=int, default=50, help="argument fragments of the tool call")
    p.add_argument(
        "--unique-calls", action="store_true", help="each answer's call an id of its own"
    )
    args = p.parse_args(argv)
    install_uvloop()
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
