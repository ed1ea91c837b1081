"""A scripted Chat Completions backend: a real aiohttp server on 127.0.0.1, for tests.

    backend = ScriptedBackend()
    base_url = await backend.start()            # "http://127.0.0.1:<port>/v1"
    backend.script([*text_chunks(["Hel", "lo"]), finish("stop"), usage(3, 2), DONE])
    ...                                         # POST {base_url}/chat/completions
    backend.requests[-1]                        # the JSON body the backend received
    await backend.stop()

Scripts. Each `POST /v1/chat/completions` takes the next queued script (`script()` queues
one, `script(a, b)` several, consumed in order); with the queue empty it asks
`responder(body) -> steps` if one is set (for concurrent tests that answer by content),
else plays `default_script` (a short text answer). A script is a list of steps:

- `dict`: one chunk, sent as `data: <json>\\n\\n`
- `str`: sent as `data: <str>\\n\\n` verbatim (`"[DONE]"`, or malformed JSON on purpose)
- `bytes`: written raw (partial frames, comments, `\\r\\n` framing, torn UTF-8)
- `Sleep(s)` or `("sleep", s)`: pause; `HANG` pauses until the client goes away
- `DelayHeaders(s)` as the first step: wait before sending even the response headers
- `DIE` or `("die",)`: abort the connection mid-stream (the body is left incomplete)
- as the first and only step, a whole-response override:
  `Status(status, body, headers)` (a dict body is sent as JSON, so `Status(200, completion(...))`
  is a backend that ignores `stream: true`), or `DROP` / `("refuse",)`: close the connection
  without answering.

The stream is sent with `Content-Type: text/event-stream` unless `stream_headers` says
otherwise. `DONE` is `data: [DONE]\\n\\n`; scripts do not get one implicitly, so a script
without it is a backend that closes without `[DONE]`.

Records. `records[i]` (`BackendRequest`, one per request, `GET /v1/models` included) holds
the body, headers (case-insensitive), `peer` (the client's address: the same port means the
same pooled connection), start time, `completed` (the whole script was written) and, when the
client went away before the script ended, `disconnected_at` (monotonic) and the set
`disconnected` event: `await rec.wait_disconnect()` returns how long after the script
started the client left. `disconnects` counts them; `requests` is the list of bodies.

Builders: `chunk`, `text_chunks`, `reasoning_chunks`, `tool_call_chunks`, `finish`,
`usage`, `completion` (a whole non-streamed answer), `error_chunk`.
`refusing_url()` is a `/v1` URL on a reserved local port where nothing listens.
`GET /v1/models` answers with `models` (ids).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

DONE = b"data: [DONE]\n\n"
MODEL = "scripted-backend"


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Gate:
    """Wait until the test sets `opened` (a step that waits for the test, not for time)."""

    opened: asyncio.Event


@dataclass(frozen=True, slots=True)
class DelayHeaders:
    """As the first step: wait this long before even the response headers go out."""

    seconds: float


@dataclass(frozen=True, slots=True)
class _Die:
    pass


@dataclass(frozen=True, slots=True)
class _Drop:
    pass


@dataclass(frozen=True, slots=True)
class Status:
    """A whole, non-streamed response: status, body (dict -> JSON, str or bytes), headers."""

    status: int
    body: Any = None
    headers: dict[str, str] | None = None


class _Died(Exception):
    pass


DIE = _Die()
DROP = _Drop()
HANG = Sleep(3600.0)

Step = dict[str, Any] | str | bytes | Sleep | Gate | _Die | _Drop | Status | tuple[Any, ...]


@dataclass(slots=True)
class BackendRequest:
    """One request as the backend saw it."""

    path: str
    body: Any
    headers: CIMultiDict[str]  # case-insensitive, as HTTP headers are
    raw: bytes = b""  # the body as it came
    started_at: float = field(default_factory=time.monotonic)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected_at: float | None = None
    peer: tuple[str, int] | None = None  # the client's address: same port, same connection
    completed: bool = False  # the whole script was written
    steps_written: int = 0

    async def wait_disconnect(self, timeout: float = 5.0) -> float:
        """Wait until the client has gone away; return seconds since the request started."""
        await asyncio.wait_for(self.disconnected.wait(), timeout)
        assert self.disconnected_at is not None
        return self.disconnected_at - self.started_at

    def _mark_disconnected(self) -> None:
        if self.disconnected_at is None:
            self.disconnected_at = time.monotonic()
            self.disconnected.set()


class ScriptedBackend:
    def __init__(
        self,
        *,
        default_script: list[Step] | None = None,
        responder: Callable[[Any], list[Step]] | None = None,
        models: list[str] | None = None,
        model_fields: dict[str, Any] | None = None,
        stream_headers: dict[str, str] | None = None,
    ) -> None:
        self.default_script = default_script or [
            *text_chunks(["Hello", "!"]),
            finish("stop"),
            usage(5, 2),
            DONE,
        ]
        self.responder = responder
        self.models = models or [MODEL]
        self.model_fields = model_fields or {}  # more fields of every /v1/models entry
        self.tokenizer_status = 200  # another status: /tokenize and /apply-template fail
        self.stream_headers = stream_headers or {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
        }
        self.records: list[BackendRequest] = []
        self._queue: deque[list[Step]] = deque()
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.base_url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # a tokenizer as llama.cpp, vLLM and SGLang serve it, beside /v1 (see _tokenize)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/apply-template", self._apply_template)
        # handler_cancellation: a client that goes away cancels the handler at once,
        # which is how a sleeping script notices the disconnect
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            self._stopping = True
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def script(self, *scripts: list[Step]) -> None:
        """Queue scripts, one per coming request, in order."""
        self._queue.extend(list(s) for s in scripts)

    @property
    def requests(self) -> list[Any]:
        return [r.body for r in self.records if r.path.endswith("/chat/completions")]

    @property
    def disconnects(self) -> int:
        return sum(1 for r in self.records if r.disconnected_at is not None)

    def _next_script(self, body: Any) -> list[Step]:
        if self._queue:
            return self._queue.popleft()
        if self.responder is not None:
            return list(self.responder(body))
        return list(self.default_script)

    @staticmethod
    def render(messages: list[dict[str, Any]]) -> str:
        """The scripted chat template: `<|role|> content` per message, then the prompt."""
        parts = [f"<|{m.get('role')}|> {m.get('content') or ''}" for m in messages]
        return " ".join([*parts, "<|assistant|>"])

    async def _apply_template(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.records.append(BackendRequest(request.path, body, CIMultiDict(request.headers)))
        if self.tokenizer_status != 200:
            return web.json_response({"error": "no tokenizer"}, status=self.tokenizer_status)
        return web.json_response({"prompt": self.render(body["messages"])})

    async def _tokenize(self, request: web.Request) -> web.Response:
        """One token a whitespace-separated word: of `content`/`prompt` (llama.cpp, SGLang:
        text), or of the rendered `messages` (vLLM: the template applied here)."""
        body = await request.json()
        self.records.append(BackendRequest(request.path, body, CIMultiDict(request.headers)))
        if self.tokenizer_status != 200:
            return web.json_response({"error": "no tokenizer"}, status=self.tokenizer_status)
        if "messages" in body:
            n = len(self.render(body["messages"]).split())
            return web.json_response({"count": n, "tokens": list(range(n)), "max_model_len": 4096})
        text = body.get("content", body.get("prompt", ""))
        return web.json_response({"tokens": list(range(len(text.split())))})

    async def _models(self, request: web.Request) -> web.Response:
        self.records.append(BackendRequest(request.path, None, CIMultiDict(request.headers)))
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted", **self.model_fields}
            for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw
        peer = request.transport.get_extra_info("peername") if request.transport else None
        rec = BackendRequest(request.path, body, CIMultiDict(request.headers), raw, peer=peer)
        self.records.append(rec)
        steps = [_normalise(s) for s in self._next_script(body)]
        if steps and isinstance(steps[0], DelayHeaders):
            try:
                await asyncio.sleep(steps.pop(0).seconds)
            except asyncio.CancelledError:
                if not self._stopping:
                    rec._mark_disconnected()
                raise
        if steps and isinstance(steps[0], Status):
            return _whole(steps[0])
        if steps and isinstance(steps[0], _Drop):
            _abort(request)
            raise asyncio.CancelledError  # nothing to answer; aiohttp drops the request
        resp = web.StreamResponse(status=200, headers=self.stream_headers)
        try:
            await resp.prepare(request)
            for step in steps:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, Gate):
                    await step.opened.wait()
                elif isinstance(step, _Die):
                    _abort(request)
                    raise _Died
                else:
                    await resp.write(_frame(step))
                rec.steps_written += 1
            await resp.write_eof()
            rec.completed = True
        except _Died:
            raise asyncio.CancelledError from None  # the connection is gone; nothing to finish
        except (asyncio.CancelledError, ConnectionError):
            if not self._stopping:  # the client went away, not the server
                rec._mark_disconnected()
            raise
        return resp


def _normalise(step: Step) -> Any:
    if isinstance(step, tuple):
        kind = step[0]
        if kind == "sleep":
            return Sleep(float(step[1]))
        if kind == "die":
            return DIE
        if kind in ("refuse", "drop"):
            return DROP
        raise ValueError(f"unknown script step {step!r}")
    return step


def _frame(step: Any) -> bytes:
    if isinstance(step, bytes):
        return step
    if isinstance(step, str):
        return b"data: " + step.encode() + b"\n\n"
    if isinstance(step, dict):
        return b"data: " + orjson.dumps(step) + b"\n\n"
    raise ValueError(f"unknown script step {step!r}")


def _whole(status: Status) -> web.Response:
    headers = dict(status.headers or {})
    body = status.body
    if isinstance(body, (dict, list)):
        headers.setdefault("Content-Type", "application/json")
        return web.Response(status=status.status, body=orjson.dumps(body), headers=headers)
    if isinstance(body, str):
        body = body.encode()
    headers.setdefault("Content-Type", "text/plain")
    return web.Response(status=status.status, body=body or b"", headers=headers)


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


# ---------------------------------------------------------------- builders


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk`."""
    if choices is None:
        choices = [
            {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}
        ]
    out: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def text_chunks(parts: list[str], *, role: bool = True) -> list[dict[str, Any]]:
    """Text deltas; the first carries `role: assistant` as real backends do."""
    out = []
    for i, part in enumerate(parts):
        delta: dict[str, Any] = {"content": part}
        if role and i == 0:
            delta["role"] = "assistant"
        out.append(chunk(delta))
    return out


def reasoning_chunks(parts: list[str], *, field: str = "reasoning_content") -> list[dict[str, Any]]:
    return [chunk({field: part}) for part in parts]


def tool_call_chunks(
    index: int, id: str, name_parts: list[str], arg_parts: list[str]
) -> list[dict[str, Any]]:
    """One call's fragments: id and the first name piece, further name pieces, then arguments."""
    out = []
    for i, name in enumerate(name_parts or [""]):
        call: dict[str, Any] = {"index": index, "function": {"name": name}}
        if i == 0:
            call.update(id=id, type="function")
            call["function"]["arguments"] = ""
        out.append(chunk({"tool_calls": [call]}))
    out.extend(
        chunk({"tool_calls": [{"index": index, "function": {"arguments": a}}]}) for a in arg_parts
    )
    return out


def finish(reason: str = "stop") -> dict[str, Any]:
    return chunk({}, finish_reason=reason)


def usage(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """A usage-only chunk (empty `choices`), as sent with `stream_options.include_usage`."""
    return chunk(
        choices=[],
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    )


def error_chunk(
    message: str, code: str | None = "server_error", type: str = "server_error"
) -> dict[str, Any]:
    """An in-stream error payload, as vLLM and llama.cpp send when generation fails."""
    return {"error": {"message": message, "type": type, "code": code}}


def completion(
    text: str | None = None,
    *,
    tool_calls: list[tuple[str, str, str]] | None = None,
    reasoning: str | None = None,
    finish_reason: str = "stop",
    prompt_tokens: int = 5,
    completion_tokens: int = 2,
) -> dict[str, Any]:
    """A whole `chat.completion`; `tool_calls` as `(id, name, arguments)` triples."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in tool_calls
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


_reserved: list[socket.socket] = []


def refusing_url() -> str:
    """A `/v1` URL on 127.0.0.1 where connections are refused.

    The port stays bound (not listening) for the life of the process, so nothing else
    can take it and start answering.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _reserved.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
