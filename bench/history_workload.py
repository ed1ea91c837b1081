"""The history benchmark's workload and clients (bench_history.py): Codex-like conversations.

A conversation of K items alternating a namespaced `function_call` and its 1 kB
`function_call_output` (issue 31's shape), 8 namespaced tools, `instructions`, a short
answer from the load backend (a few text deltas and a call on the first tool). Three ways
to send a turn:

- `full`: HTTP, the whole history every turn, `store: false` (Codex over HTTP, the Agents
  SDK with `store: false`): the last turn's input, its output as it came, the new item;
- `prev`: HTTP with `previous_response_id` and `store: true`: only the new item (the call's
  output) is sent, the gateway keeps the rest;
- `ws`: the Responses WebSocket mode, `previous_response_id` on the socket, `store: false`.

The clients are blocking and sequential (one turn at a time: CPU per turn, not throughput),
a kept-alive socket each, so that they cost the gateway core nothing between turns.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import orjson

OUTPUT = ("total 8\ndrwxr-xr-x 2 user user 4096 Jan  1 00:00 [dir] {x}, y\n" * 20)[:1000]
INSTRUCTIONS = "You are a coding agent. Run commands with the tools you have. " * 8
MODEL = "bench"
NAMESPACES = 8


def tools() -> list[dict[str, Any]]:
    """8 namespaced tools (`mcp__server<j>` with one function `run` each)."""
    params = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return [
        {"type": "namespace", "name": f"mcp__server{j}", "description": "A server.",
         "tools": [{"type": "function", "name": "run", "description": "Runs it.",
                    "parameters": params}]}
        for j in range(NAMESPACES)
    ]  # fmt: skip


def history(k: int) -> list[dict[str, Any]]:
    """A user message, then K items: a namespaced call and its 1 kB output, alternating."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}
    ]
    for i in range(k // 2):
        arguments = orjson.dumps({"q": f"ls -la /tmp/dir{i}", "workdir": "/work"}).decode()
        items.append(
            {"type": "function_call", "call_id": f"call_{i}", "name": "run",
             "namespace": f"mcp__server{i % NAMESPACES}", "arguments": arguments}
        )  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": OUTPUT})
    return items


def request(input_items: list[dict[str, Any]], *, store: bool, stream: bool = True) -> dict:
    return {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": input_items,
        "tools": tools(),
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": store,
        "stream": stream,
    }


def full_body(k: int) -> bytes:
    """The `full` turn: the whole history, nothing stored."""
    return orjson.dumps(request(history(k), store=False))


def next_items(call_id: str) -> list[dict[str, Any]]:
    """A continuation's new items: the output of the call the last answer made."""
    return [{"type": "function_call_output", "call_id": call_id, "output": OUTPUT}]


def continuation(previous: str, call_id: str, *, store: bool) -> dict[str, Any]:
    body = request(next_items(call_id), store=store)
    body["previous_response_id"] = previous
    return body


class TurnFailed(RuntimeError):
    pass


def completed(events: bytes) -> tuple[str, str, list[dict[str, Any]]]:
    """The terminal `response.completed` of a stream (SSE or WS frames joined by newlines):
    the response id, the call id of its function call ("" if none), its output items."""
    at = events.rfind(b'"response.completed"')
    if at < 0:
        raise TurnFailed("no response.completed: " + events[-300:].decode(errors="replace"))
    start = events.rfind(b"\n", 0, at) + 1
    line = events[start : events.find(b"\n", at) if events.find(b"\n", at) >= 0 else None]
    line = line.removeprefix(b"data:").strip()
    event = orjson.loads(line)
    response = event["response"]
    output = response.get("output") or []
    calls = [o for o in output if o.get("type") == "function_call"]
    return response["id"], calls[0]["call_id"] if calls else "", output


class HttpClient:
    """POST over one kept-alive HTTP/1.1 connection; the answer's body, de-chunked."""

    def __init__(self, url: str, api_key: str = "") -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.api_key = api_key
        self.sock: socket.socket | None = None
        self.buf = bytearray()

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=300)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = bytearray()
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        sock = self._connect()
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        _send_all(sock, [memoryview(head), memoryview(body)])  # the body not copied
        status, headers = self._head()
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            data = self._chunked()
        elif b"content-length" in headers:
            data = self._exactly(int(headers[b"content-length"]))
        else:  # until the server closes
            data = bytes(self.buf) + self._rest()
            self.close()
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, data

    def _fill(self) -> None:
        assert self.sock is not None
        got = self.sock.recv(1 << 20)
        if not got:
            raise TurnFailed("the server closed the connection")
        self.buf += got

    def _head(self) -> tuple[int, dict[bytes, bytes]]:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        lines = bytes(self.buf[:end]).split(b"\r\n")
        del self.buf[: end + 4]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return int(lines[0].split()[1]), headers

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            while (eol := self.buf.find(b"\r\n")) < 0:
                self._fill()
            size = int(bytes(self.buf[:eol]).split(b";")[0], 16)
            del self.buf[: eol + 2]
            out += self._exactly(size + 2)[:size]
            if size == 0:
                return bytes(out)

    def _rest(self) -> bytes:
        assert self.sock is not None
        chunks = []
        while got := self.sock.recv(1 << 20):
            chunks.append(got)
        return b"".join(chunks)


def _send_all(sock: socket.socket, parts: list[memoryview]) -> None:
    """`sock.sendall(b"".join(parts))` in vectored writes (a timeout's socket may take part)."""
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts.pop(0))
        if parts:
            parts[0] = parts[0][sent:]


class WsClient:
    """One Responses WebSocket: a `response.create` frame, the events until the terminal."""

    def __init__(self, url: str, api_key: str = "") -> None:
        from websockets.sync.client import connect

        ws_url = url.replace("http://", "ws://", 1) + "/v1/responses"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.ws = connect(ws_url, additional_headers=headers, max_size=None, open_timeout=10)

    def turn(self, body: dict[str, Any]) -> bytes:
        frame = {k: v for k, v in body.items() if k != "stream"}
        self.ws.send(orjson.dumps({"type": "response.create", **frame}).decode())
        frames = []
        while True:
            msg = self.ws.recv(timeout=300)
            raw = msg.encode() if isinstance(msg, str) else msg
            frames.append(raw)
            if b'"response.completed"' in raw[:64] or b'"response.failed"' in raw[:64]:
                return b"\n".join(frames)
            if b'"type":"error"' in raw[:40]:
                raise TurnFailed(raw[:400].decode(errors="replace"))

    def close(self) -> None:
        self.ws.close()


class Conversation:
    """One conversation through a target in one mode: `start` sends the K-item history,
    `turn` one more turn (the whole history again for `full`, else only the new item)."""

    def __init__(self, url: str, mode: str, api_key: str = "") -> None:
        self.mode = mode
        self.http = HttpClient(url, api_key) if mode != "ws" else None
        self.ws = WsClient(url, api_key) if mode == "ws" else None
        self.previous, self.call_id = "", ""
        self.items: list[dict[str, Any]] = []  # `full`: what the next turn sends

    def _send(self, body: dict[str, Any]) -> None:
        if self.ws is not None:
            answer = completed(self.ws.turn(body))
        else:
            assert self.http is not None
            status, data = self.http.post("/v1/responses", orjson.dumps(body))
            if status != 200:
                raise TurnFailed(f"HTTP {status}: {data[:300].decode(errors='replace')}")
            answer = completed(data)
        self.previous, self.call_id, output = answer
        if not self.call_id:
            raise TurnFailed("the answer made no call to continue from")
        if self.mode == "full":
            self.items = [*self.items, *output, *next_items(self.call_id)]

    def start(self, k: int) -> None:
        self.items = history(k)
        self._send(request(self.items, store=self.mode == "prev"))

    def turn(self) -> None:
        if self.mode == "full":
            self._send(request(self.items, store=False))
            return
        self._send(continuation(self.previous, self.call_id, store=self.mode == "prev"))

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.ws is not None:
            self.ws.close()
