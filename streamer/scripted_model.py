"""The embedded scripted model: a tiny deterministic Chat Completions backend.

`streamer serve` with no `--upstream` puts this in front of the gateway, so the whole
thing can be seen working (text, reasoning, namespaced tool calls, tool results) with no
model server. It is stateless: every answer is decided from the chat request alone.

- The last message is a `tool` result -> a text answer quoting it.
- The last user message mentions a provided tool (its flat name, or the tail after the last
  `__`, as a word; failing both, the tail's last `_` word: `get_weather` -> `weather`) -> a
  call to it, arguments filled from its JSON schema; two mentioned tools -> two parallel calls.
- Otherwise -> `You said: <message>`, word by word, after a short `reasoning_content` when
  the request carries `reasoning_effort`.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

_ids = itertools.count(1)  # ids are the only thing that varies between identical requests
_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'|`([^`]+)`|“([^”]+)”")
_CONNECTORS = {"and", "then", "also", "plus"}
_QUOTE_LIMIT = 200


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    fragments: list[str]


@dataclass(slots=True)
class Reply:
    """What the model answers, before it is encoded as chunks or as one completion."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    finish: str = "stop"
    prompt_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.content) + sum(len(c.fragments) for c in self.calls)


# --- reading the request -------------------------------------------------------------


def _text_of(content: Any) -> str:
    """Message content as plain text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "\n".join(p for p in parts if isinstance(p, str) and p)
    return ""


def _words(text: str) -> int:
    return len(text.split())


def _tool_names(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(flat name, parameters schema) for each function tool, in request order."""
    found = []
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            params = fn.get("parameters")
            found.append((fn["name"], params if isinstance(params, dict) else {}))
    return found


def _tail(flat: str) -> str:
    """The member part of a flat name: after the last `__` (or `.`), leading `_` dropped."""
    tail = re.split(r"__|\.", flat)[-1].lstrip("_")
    return tail or flat


def _mention(text: str, word: str) -> int:
    """Position of `word` in `text` as a whole word (underscores count as letters), or -1."""
    m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text, re.IGNORECASE)
    return m.start() if m else -1


def _mentioned_tools(
    text: str, tools: list[tuple[str, dict[str, Any]]]
) -> list[tuple[int, str, dict[str, Any]]]:
    """Tools the text mentions, ordered by where they are first mentioned.

    A full flat name wins over a bare tail; a tail shared by several tools goes to the first
    of them, so one mention never fans out into several calls.
    """
    hits: dict[str, tuple[int, str, dict[str, Any]]] = {}
    taken_tails: set[str] = set()
    for flat, params in tools:
        pos = _mention(text, flat)
        if pos >= 0:
            hits[flat] = (pos, flat, params)
            taken_tails.add(_tail(flat).lower())
    for flat, params in tools:
        tail = _tail(flat)
        if flat in hits or tail.lower() in taken_tails:
            continue
        pos = _mention(text, tail)
        if pos >= 0:
            hits[flat] = (pos, flat, params)
            taken_tails.add(tail.lower())
    if not hits:  # the weakest mention: the name's last word ("weather" for get_weather)
        for flat, params in tools:
            word = _tail(flat).rsplit("_", 1)[-1]
            pos = _mention(text, word) if len(word) >= 4 else -1
            if pos >= 0:
                return [(pos, flat, params)]
    return sorted(hits.values(), key=lambda h: h[0])


def _string_value(segment: str, prop: str, fallback: str) -> str:
    """Text for a string argument: a quoted string, else the words after the property name."""
    m = _QUOTED.search(segment)
    if m:
        return next(g for g in m.groups() if g is not None)
    pos = _mention(segment, prop)
    if pos >= 0:
        words = segment[pos + len(prop) :].split()
        while words and words[-1].lower().strip(",.;:!?") in _CONNECTORS:
            words.pop()
        value = " ".join(words).strip(" ,.;:!?")
        if value:
            return value
    return fallback


def _value_for(schema: Any, prop: str, segment: str, fallback: str) -> Any:
    if not isinstance(schema, dict):
        return fallback
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return _arguments(schema, segment, fallback)
    return _string_value(segment, prop, fallback)


def _arguments(schema: dict[str, Any], segment: str, fallback: str) -> dict[str, Any]:
    """Arguments satisfying the schema's required properties (and a custom tool's `input`)."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    required = [p for p in schema.get("required") or [] if p in props]
    if "input" in props and "input" not in required:
        required.append("input")
    return {p: _value_for(props[p], p, segment, fallback) for p in required}


def _fragments(text: str, pieces: int = 3) -> list[str]:
    step = max(1, -(-len(text) // pieces))
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


def _word_pieces(text: str) -> list[str]:
    """Words with their trailing whitespace, so the pieces concatenate back to `text`."""
    return re.findall(r"\S+\s*", text) or [text]


def _forced_tool(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        fn = choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def plan_reply(body: dict[str, Any]) -> Reply:
    """Decide the whole answer to one chat request (pure)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    reply = Reply(prompt_tokens=sum(_words(_text_of(m.get("content"))) for m in messages))
    tools = _tool_names(body)
    choice = body.get("tool_choice")

    trailing_results: list[str] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        trailing_results.insert(0, " ".join(_text_of(m.get("content")).split())[:_QUOTE_LIMIT])
    user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    user_text = " ".join(_text_of(user.get("content")).split()) if user else ""

    if trailing_results:
        label = "Tool result" if len(trailing_results) == 1 else "Tool results"
        answer = f"{label}: " + " | ".join(trailing_results)
        thought = "A tool returned; I will report its result."
    else:
        hits = [] if choice == "none" or not tools else _mentioned_tools(user_text, tools)
        forced = _forced_tool(body)
        if forced is not None and choice != "none":
            hits = [h for h in hits if h[1] == forced] or [(0, forced, dict(tools).get(forced, {}))]
        elif not hits and choice == "required" and tools:
            hits = [(0, tools[0][0], tools[0][1])]
        if body.get("parallel_tool_calls") is False:
            hits = hits[:1]
        if hits:
            fallback = user_text[:_QUOTE_LIMIT]
            for i, (pos, name, params) in enumerate(hits):
                end = hits[i + 1][0] if i + 1 < len(hits) else len(user_text)
                args = _arguments(params, user_text[pos:end], fallback)
                reply.calls.append(
                    _Call(f"call_{next(_ids):08d}", name, _fragments(orjson.dumps(args).decode()))
                )
            reply.finish = "tool_calls"
            if body.get("reasoning_effort"):
                names = " and ".join(name for _, name, _ in hits)
                reply.reasoning = _word_pieces(f"The user asked for {names}; calling it.")
            return reply
        answer = f"You said: {user_text}" if user_text else "Hello from the scripted model."
        thought = f"The user wrote {_words(user_text)} words; I will answer directly."

    if body.get("reasoning_effort"):
        reply.reasoning = _word_pieces(thought)
    reply.content = _word_pieces(answer)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and limit > 0 and len(reply.content) > limit:
        reply.content = reply.content[:limit]
        reply.finish = "length"
    return reply


# --- encoding ------------------------------------------------------------------------


def _usage(reply: Reply) -> dict[str, Any]:
    out = reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": out,
        "total_tokens": reply.prompt_tokens + out,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": len(reply.reasoning)},
    }


def stream_chunks(reply: Reply, model: str, include_usage: bool) -> list[dict[str, Any]]:
    """The reply as `chat.completion.chunk` objects, in the order a backend sends them."""
    base = {
        "id": f"chatcmpl-scripted-{next(_ids)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in reply.reasoning]
    chunks += [chunk({"content": piece}) for piece in reply.content]
    for index, call in enumerate(reply.calls):
        head = {"index": index, "id": call.id, "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        )
        for piece in call.fragments:
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, reply.finish))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(reply)})
    return chunks


def completion(reply: Reply, model: str) -> dict[str, Any]:
    """The reply as one non-streaming `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.content) or None}
    if reply.reasoning:
        message["reasoning_content"] = "".join(reply.reasoning)
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": "".join(c.fragments)},
            }
            for c in reply.calls
        ]
    return {
        "id": f"chatcmpl-scripted-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish}],
        "usage": _usage(reply),
    }


# --- the HTTP shell ------------------------------------------------------------------


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return web.json_response(
        {"error": error}, status=status, dumps=lambda o: orjson.dumps(o).decode()
    )


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _error(400, "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object.")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return _error(400, "'messages' must be a non-empty array.", "messages")
    reply = plan_reply(body)
    named = body.get("model")
    model = named if isinstance(named, str) else "scripted"
    if not body.get("stream"):
        return web.Response(
            body=orjson.dumps(completion(reply, model)), content_type="application/json"
        )

    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for item in stream_chunks(reply, model, include_usage):
        await response.write(b"data: " + orjson.dumps(item) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _models(request: web.Request) -> web.Response:
    data = [{"id": "scripted", "object": "model", "created": 0, "owned_by": "streamer"}]
    return web.Response(
        body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
    )


def create_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    return app


async def start_scripted_model(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve the scripted model; returns the runner (clean it up) and its `.../v1` base URL."""
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    if ":" in bound_host:
        bound_host = f"[{bound_host}]"
    return runner, f"http://{bound_host}:{bound_port}/v1"
