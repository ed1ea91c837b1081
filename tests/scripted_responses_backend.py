"""A scripted Responses backend (`POST /v1/responses`): a real aiohttp server, for tests.

    backend = ScriptedResponsesBackend(personality="vllm")
    base_url = await backend.start()
    backend.script([*text_chunks(["Hel", "lo"]), finish("stop"), usage(3, 2), DONE])

Scripts are `ScriptedBackend`'s (tests/scripted_backend.py), so one script plays against
either kind of backend: Chat chunks are translated into the Responses event stream a real
backend sends for the same answer (`event:` + `data:` frames with their own ids and
`sequence_number`s; `response.output_item.added`, the `*.delta` events, `output_item.done`,
then `response.completed` / `response.incomplete` at `[DONE]`, or at the end of a script
that had a finish reason); an error payload becomes an `error` event. A step that is a
Responses event already (a dict with a `type`) is sent as it is; `Status`, `DIE`, sleeps,
gates and raw bytes work as in `ScriptedBackend`.

Personalities: how real backends treat what they are sent and how they spell names.
- "flat" (default): takes function tools; answers with the names as scripted.
- "vllm": answers 400 to namespace tools (vLLM's harmony models) and custom tools; reasoning
  streams as `response.reasoning_text.*`.
- "llamacpp": keeps only function tools, silently (`kept_tools` says what it kept).
- "ollama": takes namespace tools; answers with `ns.name` (script the dotted name).
- "openai": takes namespace, custom and hosted tools; a scripted `ns.name` goes out split
  into `namespace` and `name`, as OpenAI answers.
"""

from __future__ import annotations

from typing import Any

import orjson
from scripted_backend import DONE, ScriptedBackend, Status, Step


def _frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class _Translation:
    """Chat chunks of one script -> the Responses events of the same answer."""

    def __init__(self, personality: str) -> None:
        self.personality = personality
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the message or reasoning item streaming
        self.calls: dict[int, dict[str, Any]] = {}  # chat index -> call item (name growing)
        self.call_at: dict[int, int] = {}  # chat index -> output_index, once added
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.ended = False

    def event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return _frame(event)

    def steps(self, script: list[Step]) -> list[Any]:
        out: list[Any] = [self.event("response.created", response=self.response("in_progress"))]
        for step in script:
            if isinstance(step, Status):
                return [step]
            if step == DONE or step == "[DONE]":
                out += self.end()
            elif isinstance(step, dict) and isinstance(step.get("type"), str):
                out.append(_frame({**step, "sequence_number": self.seq}))
                self.seq += 1
            elif isinstance(step, dict) and "error" in step:
                err = step["error"]
                out.append(self.event("error", code=err.get("code"), message=err.get("message")))
                self.ended = True
            elif isinstance(step, dict):
                out += self.chunk(step)
            else:
                out.append(step)
        if self.finish is not None and not self.ended:
            out += self.end()
        return out

    def response(self, status: str) -> dict[str, Any]:
        body: dict[str, Any] = {"id": "resp_backend", "object": "response", "status": status}
        body["output"] = list(self.output) if status != "in_progress" else []
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        usage = chunk.get("usage")
        if usage:
            self.usage = {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
                "input_tokens_details": {
                    "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                },
                "output_tokens_details": {
                    "reasoning_tokens": usage.get("completion_tokens_details", {}).get(
                        "reasoning_tokens", 0
                    )
                },
            }
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self.text("reasoning", reasoning)
            if delta.get("content"):
                out += self.text("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self.call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def text(self, kind: str, piece: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != kind:
            out += self.close_open()
            out += self.add_calls()
            index = len(self.output)
            if kind == "message":
                item = {"type": "message", "id": f"msg_b{index}", "role": "assistant",
                        "status": "in_progress", "content": []}  # fmt: skip
                part = {"type": "output_text", "text": "", "annotations": []}
            else:
                item = {"type": "reasoning", "id": f"rs_b{index}", "summary": [], "content": []}
                part = {"type": "reasoning_text", "text": ""}
            self.open = {"type": kind, "item": item, "index": index, "text": ""}
            self.output.append(item)
            out.append(self.event("response.output_item.added", output_index=index, item=item))
            out.append(
                self.event("response.content_part.added", output_index=index,
                           item_id=item["id"], content_index=0, part=part)
            )  # fmt: skip
        opened = self.open
        opened["text"] += piece
        delta_type = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        out.append(
            self.event(delta_type, output_index=opened["index"], item_id=opened["item"]["id"],
                       content_index=0, delta=piece)
        )  # fmt: skip
        return out

    def close_open(self) -> list[bytes]:
        opened, self.open = self.open, None
        if opened is None:
            return []
        item, text = opened["item"], opened["text"]
        if opened["type"] == "message":
            item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
            item["status"] = "completed"
        else:
            item["content"] = [{"type": "reasoning_text", "text": text}]
        return [self.event("response.output_item.done", output_index=opened["index"], item=item)]

    def spelled(self, item: dict[str, Any]) -> dict[str, Any]:
        name = item["name"]
        if self.personality == "openai" and "." in name:  # OpenAI answers the pair
            namespace, _, item["name"] = name.rpartition(".")
            item["namespace"] = namespace
        return item

    def call(self, call: dict[str, Any]) -> list[bytes]:
        index, function = call.get("index", 0), call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            item = self.calls[index] = {
                "type": "function_call", "id": f"fc_b{index}", "call_id": call.get("id"),
                "name": "", "arguments": "", "status": "in_progress",
            }  # fmt: skip
        if index not in self.call_at:
            item["name"] += function.get("name") or ""
        arguments = function.get("arguments") or ""
        if not arguments:
            return []
        out = self.add_call(index)
        item["arguments"] += arguments
        out.append(
            self.event("response.function_call_arguments.delta", output_index=self.call_at[index],
                       item_id=item["id"], delta=arguments)
        )  # fmt: skip
        return out

    def add_call(self, index: int) -> list[bytes]:
        if index in self.call_at:
            return []
        out = self.close_open()
        item = self.spelled(self.calls[index])
        self.call_at[index] = at = len(self.output)
        self.output.append(item)
        added = {**item, "arguments": ""}
        out.append(self.event("response.output_item.added", output_index=at, item=added))
        return out

    def add_calls(self) -> list[bytes]:
        out: list[bytes] = []
        for index in self.calls:
            out += self.add_call(index)
        return out

    def end(self) -> list[bytes]:
        if self.ended:
            return []
        self.ended = True
        out = self.close_open() + self.add_calls()
        for index, at in self.call_at.items():
            item = self.calls[index]
            item["status"] = "completed"
            out.append(
                self.event("response.function_call_arguments.done", output_index=at,
                           item_id=item["id"], arguments=item["arguments"])
            )  # fmt: skip
            out.append(self.event("response.output_item.done", output_index=at, item=item))
        if self.finish == "length":
            body = self.response("incomplete")
            body["incomplete_details"] = {"reason": "max_output_tokens"}
            return [*out, self.event("response.incomplete", response=body)]
        return [*out, self.event("response.completed", response=self.response("completed"))]


_NOT_FUNCTIONS = {"namespace", "custom"}


class ScriptedResponsesBackend(ScriptedBackend):
    """`ScriptedBackend`'s scripts and records, served as `POST /v1/responses`."""

    def __init__(self, *, personality: str = "flat", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.personality = personality
        self.kept_tools: list[list[dict[str, Any]]] = []  # per request: the tools it used

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/responses", self._chat)
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
        return [r.body for r in self.records if r.path.endswith("/responses")]

    def _next_script(self, body: Any) -> list[Step]:
        script = super()._next_script(body)
        tools = body.get("tools") or [] if isinstance(body, dict) else []
        refused = self._refused(tools)
        if refused is not None:
            return [refused]
        self.kept_tools.append(
            [t for t in tools if self.personality != "llamacpp" or t.get("type") == "function"]
        )
        return _Translation(self.personality).steps(script)

    def _refused(self, tools: list[dict[str, Any]]) -> Status | None:
        if self.personality != "vllm":
            return None
        for i, tool in enumerate(tools):
            if tool.get("type") in _NOT_FUNCTIONS:
                message = f"tools[{i}]: unsupported tool type {tool['type']!r}"
                error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
                return Status(400, {"error": error})
        return None


def response_events(*events: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses events as script steps (sent as they are, numbered)."""
    return list(events)
