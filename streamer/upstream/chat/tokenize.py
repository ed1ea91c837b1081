"""Counting a lowered request's tokens with the backend's own tokenizer (pure).

`POST /v1/responses/input_tokens` lowers the request as a turn would, then asks the backend
to count it, in the backend's own terms (a row of `TOKENIZERS`, named by its profile):

- `vllm`: `POST /tokenize` takes the Chat request's `messages` and `tools` and applies the
  model's chat template itself (`add_generation_prompt`, as a turn does).
- `llamacpp`: `POST /apply-template` renders the messages and tools with the model's
  template, then `POST /tokenize` counts the rendered prompt (special tokens parsed).
- `sglang`: `POST /tokenize` takes text only: the lowered messages as plain text.

Paths are from the server's root (these servers serve them beside `/v1`, not under it).
A backend with no tokenizer row, or one whose tokenizer fails, gets the usage estimate
(`CHARS_PER_TOKEN` characters of the request's JSON a token), marked as an estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from streamer.core.output import CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class TokenizerAPI:
    name: str
    tokenize_path: str
    """POST: counts tokens; answers `{"count": n}` or `{"tokens": [...]}`."""
    template_path: str | None = None
    """POST `{"messages", "tools"}` -> `{"prompt": text}` (the model's chat template)."""
    chat: bool = False
    """`tokenize_path` takes the chat messages and applies the template itself."""
    text_field: str = "prompt"
    """Where the text goes when `tokenize_path` takes text."""
    extra: tuple[tuple[str, Any], ...] = ()
    """Fields every tokenize request carries."""


TOKENIZERS: dict[str, TokenizerAPI] = {
    t.name: t
    for t in (
        # vLLM: TokenizeChatRequest (vllm/entrypoints/openai/protocol.py) takes messages and
        # tools, applies the chat template; answers count, tokens, max_model_len.
        TokenizerAPI("vllm", "/tokenize", chat=True, extra=(("add_generation_prompt", True),)),
        # llama.cpp server: /apply-template takes a chat body and answers {prompt};
        # /tokenize {content, add_special, parse_special} answers {tokens}.
        TokenizerAPI(
            "llamacpp",
            "/tokenize",
            template_path="/apply-template",
            text_field="content",
            extra=(("add_special", True), ("parse_special", True)),
        ),
        # SGLang: /tokenize {model, prompt} answers tokens, count, max_model_len (text only).
        TokenizerAPI("sglang", "/tokenize"),
    )
}


def template_body(chat_request: Mapping[str, Any]) -> dict[str, Any]:
    """What a template endpoint renders: the messages and tools a turn would send."""
    return {k: chat_request[k] for k in ("messages", "tools") if k in chat_request}


def tokenize_body(
    api: TokenizerAPI, chat_request: Mapping[str, Any], prompt: str | None = None
) -> dict[str, Any]:
    """The tokenize request: the chat itself, the rendered `prompt`, or the lowered text."""
    body: dict[str, Any] = dict(api.extra)
    if isinstance(chat_request.get("model"), str) and chat_request["model"]:
        body["model"] = chat_request["model"]
    if api.chat:
        body.update(template_body(chat_request))
    else:
        body[api.text_field] = prompt if prompt is not None else lowered_text(chat_request)
    return body


def lowered_text(chat_request: Mapping[str, Any]) -> str:
    """The messages as plain text (role, then content; tool calls and tools as JSON), for a
    tokenizer that takes text and offers no template."""
    lines: list[str] = []
    for message in chat_request.get("messages") or ():
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
            )
        lines.append(f"{message.get('role', '')}: {content or ''}")
        if message.get("tool_calls"):
            lines.append(orjson.dumps(message["tool_calls"]).decode())
    if chat_request.get("tools"):
        lines.append(orjson.dumps(chat_request["tools"]).decode())
    return "\n".join(lines)


def prompt_of(answer: bytes) -> str:
    """The rendered prompt of a template endpoint's answer (ValueError if it has none)."""
    data = orjson.loads(answer)
    if not isinstance(data, dict) or not isinstance(data.get("prompt"), str):
        raise ValueError("the template answer has no prompt")
    return data["prompt"]


def count_of(answer: bytes) -> int:
    """The token count of a tokenize answer (ValueError if it has none)."""
    data = orjson.loads(answer)
    if isinstance(data, dict):
        count = data.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            return count
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
    raise ValueError("the tokenize answer has no count")


def estimate(chat_request: Mapping[str, Any]) -> int:
    """The usage estimate's count for the prompt (`estimate_usage`): its JSON's length."""
    prompt = template_body(chat_request)
    return -(-len(orjson.dumps(prompt)) // CHARS_PER_TOKEN)


def input_tokens_object(count: int, estimated: bool) -> dict[str, Any]:
    """The answer of `/v1/responses/input_tokens` (OpenAI's `response.input_tokens`);
    `estimated: true` when no tokenizer counted it."""
    body: dict[str, Any] = {"object": "response.input_tokens", "input_tokens": count}
    if estimated:
        body["estimated"] = True
    return body
