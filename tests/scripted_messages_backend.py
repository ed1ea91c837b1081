"""A scripted Anthropic Messages backend (`POST /v1/messages`): a real aiohttp server, for tests.

    backend = ScriptedMessagesBackend()
    base_url = await backend.start()
    backend.script([*reasoning_chunks(["Let me see."]), *text_chunks(["Hi"]), finish("stop"),
                    usage(30, 5, cached=20), DONE])

Scripts are `ScriptedBackend`'s (tests/scripted_backend.py), so one script plays against
every kind: Chat chunks become exactly the events Anthropic documents for the same answer
(platform.claude.com "Streaming messages"): `message_start` (its usage), per block
`content_block_start`, the `text_delta` / `thinking_delta` / `input_json_delta` deltas and
`content_block_stop` (a thinking block is closed with a `signature_delta`: the backend signs
what it thought), a `ping` after the first block starts, then `message_delta` (the stop
reason: end_turn, tool_use, max_tokens; the output usage) and `message_stop`. Each event is
`event: <type>` + `data: <json>`. An error payload (`error_chunk`) becomes an `error` event;
a step that is a Messages event already (a dict whose `type` is one) is sent as it is; the
builders here add what a Chat script has no words for: `redacted(data)` (a
`redacted_thinking` block) and `cache(read, write)` (cache reads and writes in the usage).
`Status`, `DIE`, sleeps, gates and raw bytes work as in `ScriptedBackend`.

Like Anthropic, it refuses (400 `invalid_request_error`, the API's error shape) a request
that breaks the API's rules, so a test sees what the real API would say: `max_tokens`
missing, roles that do not alternate or do not open with `user`, empty text blocks, a
`tool_use` not answered by a `tool_result` at the start of the next message (or a result
answering none), tool blocks without `tools`, more than 4 `cache_control` breakpoints, a
thinking budget under 1024 or not under `max_tokens`, a forced tool with budgeted thinking,
a thinking block whose signature it did not make, a redacted block it did not send, and,
with thinking on, a tool loop whose last assistant message does not open with its thinking.
`rejections` lists the reasons it gave.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import orjson
from scripted_backend import DONE, ScriptedBackend, Status, Step

EVENTS = frozenset(
    {
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop", "ping", "error",
    }
)  # fmt: skip
STOPS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
BLOCK_TYPES = {
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
}


def redacted(data: str) -> dict[str, Any]:
    """A `redacted_thinking` block in the answer (its `data` opaque, as the API's is)."""
    return {"scripted": "redacted_thinking", "data": data}


def cache(read: int, write: int) -> dict[str, Any]:
    """Cache reads and writes for the answer's usage (`cache_*_input_tokens`)."""
    return {"scripted": "cache", "read": read, "write": write}


def frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def anthropic_error(status: int, kind: str, message: str) -> Status:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_s"}
    return Status(status, body)


class _Translation:
    """Chat chunks of one script -> the Messages events of the same answer."""

    def __init__(self, backend: ScriptedMessagesBackend) -> None:
        self.backend = backend
        self.index = -1
        self.open: dict[str, Any] | None = None  # {"type", "text"} of the block streaming
        self.calls: dict[int, int] = {}  # chat call index -> block index
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}
        self.finish: str | None = None
        self.ended = False
        self.pinged = False

    def steps(self, script: list[Step]) -> list[Any]:
        self._scan(script)
        message = {"id": "msg_scripted", "type": "message", "role": "assistant", "content": [],
                   "model": "scripted", "stop_reason": None, "stop_sequence": None,
                   "usage": {**self.usage, "output_tokens": 1}}  # fmt: skip
        out: list[Any] = [frame({"type": "message_start", "message": message})]
        for step in script:
            if isinstance(step, Status):
                return [step]
            if step == DONE or step == "[DONE]":
                out += self.end()
            elif isinstance(step, dict) and step.get("type") in EVENTS:
                out.append(frame(step))
            elif isinstance(step, dict) and "error" in step:
                err = step["error"]
                kind = err.get("type") or err.get("code") or "api_error"
                error = {"type": kind, "message": err.get("message")}
                out.append(frame({"type": "error", "error": error}))
                self.ended = True
            elif isinstance(step, dict) and step.get("scripted") == "redacted_thinking":
                out += self.close_open()
                out += self.start({"type": "redacted_thinking", "data": step["data"]})
                self.backend.issued.add(step["data"])
                out += self.close_open()
            elif isinstance(step, dict) and "scripted" in step:
                continue  # read by _scan
            elif isinstance(step, dict):
                out += self.chunk(step)
            else:
                out.append(step)
        if self.finish is not None and not self.ended:
            out += self.end()
        return out

    def _scan(self, script: list[Step]) -> None:
        """The usage the answer reports, known up front (message_start carries the input):
        a Chat usage's prompt tokens are the whole prompt, of which `cache` says how many
        were read from and written to the cache (the rest is `input_tokens`)."""
        for step in script:
            if not isinstance(step, dict):
                continue
            if step.get("scripted") == "cache":
                self.usage["cache_read_input_tokens"] = step["read"]
                self.usage["cache_creation_input_tokens"] = step["write"]
            elif step.get("usage"):
                u = step["usage"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                self.usage["input_tokens"] = u["prompt_tokens"] - cached
                self.usage["output_tokens"] = u["completion_tokens"]
                if cached:
                    self.usage.setdefault("cache_read_input_tokens", cached)
        if "cache_read_input_tokens" in self.usage and "cache_creation_input_tokens" in self.usage:
            read = self.usage["cache_read_input_tokens"] + self.usage["cache_creation_input_tokens"]
            self.usage["input_tokens"] = max(0, self.usage["input_tokens"] - read)

    def start(self, block: dict[str, Any]) -> list[bytes]:
        self.index += 1
        self.open = {"type": block["type"], "text": "", "index": self.index}
        out = [frame({"type": "content_block_start", "index": self.index, "content_block": block})]
        if not self.pinged:
            self.pinged = True
            out.append(frame({"type": "ping"}))
        return out

    def delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        at = self.index if index is None else index
        return frame({"type": "content_block_delta", "index": at, "delta": delta})

    def close_open(self) -> list[bytes]:
        opened, self.open = self.open, None
        if opened is None:
            return []
        out: list[bytes] = []
        if opened["type"] == "thinking":
            signature = self.backend.sign(opened["text"])
            out.append(self.delta({"type": "signature_delta", "signature": signature}))
        out.append(frame({"type": "content_block_stop", "index": opened["index"]}))
        return out

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self.text("thinking", reasoning)
            if delta.get("content"):
                out += self.text("text", delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self.call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def text(self, kind: str, piece: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != kind:
            out += self.close_open()
            empty = {"type": "text", "text": ""}
            if kind == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
            out += self.start(empty)
        assert self.open is not None
        self.open["text"] += piece
        field = "thinking" if kind == "thinking" else "text"
        out.append(self.delta({"type": f"{field}_delta", field: piece}))
        return out

    def call(self, call: dict[str, Any]) -> list[bytes]:
        index, function = call.get("index", 0), call.get("function") or {}
        out: list[bytes] = []
        if index not in self.calls:
            out += self.close_open()
            block = {"type": "tool_use", "id": call.get("id") or f"toolu_s{index}",
                     "name": function.get("name") or "", "input": {}}  # fmt: skip
            out += self.start(block)
            self.calls[index] = self.index
        arguments = function.get("arguments") or ""
        if arguments:
            piece = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self.delta(piece, self.calls[index]))
        return out

    def end(self) -> list[bytes]:
        if self.ended:
            return []
        self.ended = True
        out = self.close_open()  # a block closes when the next opens: only the last is open
        reason = STOPS.get(self.finish or "stop", "end_turn")
        delta = {"stop_reason": reason, "stop_sequence": None}
        out.append(frame({"type": "message_delta", "delta": delta, "usage": dict(self.usage)}))
        out.append(frame({"type": "message_stop"}))
        return out


class ScriptedMessagesBackend(ScriptedBackend):
    """`ScriptedBackend`'s scripts and records, served as `POST /v1/messages`."""

    def __init__(self, *, secret: bytes = b"scripted-anthropic", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.secret = secret
        self.issued: set[str] = set()  # redacted_thinking data it sent
        self.rejections: list[str] = []

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/messages", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    @property
    def requests(self) -> list[Any]:
        return [r.body for r in self.records if r.path.endswith("/messages")]

    def sign(self, text: str) -> str:
        digest = hmac.new(self.secret, text.encode(), hashlib.sha256).digest()
        return base64.b64encode(b"scripted" + digest).decode()

    def _next_script(self, body: Any) -> list[Step]:
        why = _broken(body, self) if isinstance(body, dict) else "the body is not a JSON object"
        if why is not None:
            self.rejections.append(why)
            return [anthropic_error(400, "invalid_request_error", why)]
        return _Translation(self).steps(super()._next_script(body))


def _broken(body: dict[str, Any], backend: ScriptedMessagesBackend) -> str | None:
    """What the real API would refuse in `body` (None: nothing)."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    thinking = body.get("thinking") or {}
    why = _thinking_rules(body, thinking, max_tokens) or _breakpoints(body)
    if why:
        return why
    asked: list[str] = []
    for i, message in enumerate(messages):
        why = _message_rules(i, message, messages, asked, body, backend)
        if why:
            return why
        content = message["content"] if isinstance(message["content"], list) else []
        asked = [b["id"] for b in content if b.get("type") == "tool_use"]
    if thinking.get("type") == "enabled":
        return _loop_thinking(messages)
    return None


def _thinking_rules(body: dict[str, Any], thinking: dict[str, Any], max_tokens: int) -> str | None:
    if thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if budget >= max_tokens:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    if "temperature" in body and body["temperature"] != 1:
        return "`temperature` may only be set to 1 when thinking is enabled."
    return None


def _breakpoints(body: dict[str, Any]) -> str | None:
    if orjson.dumps(body).count(b'"cache_control"') > 4:
        return "A maximum of 4 blocks with cache_control may be provided."
    return None


def _message_rules(
    i: int,
    message: Any,
    messages: list[Any],
    asked: list[str],
    body: dict[str, Any],
    backend: ScriptedMessagesBackend,
) -> str | None:
    role = message.get("role") if isinstance(message, dict) else None
    if role != ("user" if i % 2 == 0 else "assistant"):
        return f"messages.{i}: roles must alternate between user and assistant, starting with user"
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list) or not blocks:
        return f"messages.{i}: all messages must have non-empty content"
    results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
    lead = [b.get("tool_use_id") for b in blocks[: len(results)]]
    for j, block in enumerate(blocks):
        why = _block_rules(i, j, block, body, backend)
        if why:
            return why
    if asked and (sorted(lead) != sorted(asked) or results != lead):
        return (
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
            f"after: {', '.join(a for a in asked if a not in lead)}. Each `tool_use` block must "
            "have a corresponding `tool_result` block in the next message."
        )
    stray = [r for r in results if r not in asked]
    if stray:
        return f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {stray[0]}"
    return None


def _block_rules(
    i: int, j: int, block: Any, body: dict[str, Any], backend: ScriptedMessagesBackend
) -> str | None:
    where = f"messages.{i}.content.{j}"
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in BLOCK_TYPES:
        return f"{where}: unknown content block type {kind!r}"
    if kind == "text" and not str(block.get("text") or "").strip():
        return f"{where}: text content blocks must contain non-whitespace text"
    if kind in ("tool_use", "tool_result") and not body.get("tools"):
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    if kind == "thinking" and block.get("signature") != backend.sign(block.get("thinking", "")):
        return f"{where}: Invalid `signature` in `thinking` block"
    if kind == "redacted_thinking" and block.get("data") not in backend.issued:
        return f"{where}: Invalid `data` in `redacted_thinking` block"
    return None


def _loop_thinking(messages: list[Any]) -> str | None:
    """With thinking on, a tool loop's last assistant message opens with its thinking."""
    if len(messages) < 2 or messages[-2].get("role") != "assistant":
        return None
    content = messages[-2]["content"]
    if not isinstance(content, list) or not any(b.get("type") == "tool_use" for b in content):
        return None
    if content[0].get("type") in ("thinking", "redacted_thinking"):
        return None
    return (
        f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
        "`redacted_thinking`, but found `tool_use`. When `thinking` is enabled, a final "
        "`assistant` message must start with a thinking block."
    )
