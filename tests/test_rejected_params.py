"""The backends' own 400s naming a parameter they do not take (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streamer.upstream.chat.rejected_params import rejected_params, without

SENT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "stream": True,
    "stream_options": {"include_usage": True},
    "parallel_tool_calls": False,
    "user": "alice",
    "reasoning_effort": "high",
    "max_completion_tokens": 50,
    "presence_penalty": 0.5,
    "metadata": {"a": "b"},
}


def _openai(message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


# (what sent it, status, body) -> the parameters to leave out
SHAPES: dict[str, tuple[int, Any, tuple[str, ...]]] = {
    # vLLM / SGLang: pydantic's error list stringified into the message (MaxKB#2912,
    # gpustack#429)
    "vllm extra_forbidden": (
        400,
        {
            "object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'max_completion_tokens'), "
            "'msg': 'Extra inputs are not permitted', 'input': 800}]",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        ("max_completion_tokens",),
    ),
    "sglang two extras": (
        400,
        {
            "object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': "
            "'Extra inputs are not permitted', 'input': {'include_usage': True}}, {'type': "
            "'extra_forbidden', 'loc': ('body', 'user'), 'msg': 'Extra inputs are not "
            "permitted', 'input': 'alice'}]",
            "type": "BadRequestError",
            "code": 400,
        },
        ("stream_options", "user"),
    ),
    # FastAPI / Mistral: the same list as JSON (partITech/php-mistral#76)
    "fastapi 422 detail": (
        422,
        {
            "detail": [
                {
                    "type": "extra_forbidden",
                    "loc": ["body", "parallel_tool_calls"],
                    "msg": "Extra inputs are not permitted",
                    "input": False,
                }
            ]
        },
        ("parallel_tool_calls",),
    ),
    "openai unrecognized": (
        400,
        _openai("Unrecognized request argument supplied: stream_options"),
        ("stream_options",),
    ),
    "openai unsupported parameter": (
        400,
        _openai(
            "Unsupported parameter: 'max_completion_tokens' is not supported with this model.",
            "max_completion_tokens",
            "unsupported_parameter",
        ),
        ("max_completion_tokens",),
    ),
    "openai param only": (
        400,
        _openai("This model does not take it.", "stream_options", "unsupported_parameter"),
        ("stream_options",),
    ),
    "deepseek": (
        400,
        _openai(
            "deepseek-reasoner does not support the parameter `presence_penalty`",
            code="invalid_request_error",
        ),
        ("presence_penalty",),
    ),
    "llama.cpp": (400, {"error": {"code": 400, "message": "Unsupported param: user"}}, ("user",)),
    "z.ai": (400, _openai("Validation: Unsupported parameter(s): metadata"), ("metadata",)),
    # Gemini: a list body, one line per unknown top-level name
    "gemini": (
        400,
        [
            {
                "error": {
                    "code": 400,
                    "message": 'Invalid JSON payload received. Unknown name "metadata": Cannot '
                    'find field.\nInvalid JSON payload received. Unknown name "user": Cannot '
                    "find field.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ],
        ("metadata", "user"),
    ),
    "ollama thinking": (
        400,
        {"error": {"message": '"llama3.2" does not support thinking', "type": "api_error"}},
        ("reasoning_effort",),
    ),
    # never: what the client asked for, or values, or other statuses
    "ollama tools": (
        400,
        {"error": {"message": "registry.ollama.ai/library/gemma:2b does not support tools"}},
        (),
    ),
    "tools extra": (
        400,
        {
            "object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'tools'), "
            "'msg': 'Extra inputs are not permitted', 'input': []}]",
        },
        (),
    ),
    "nested field": (
        400,
        {
            "object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'messages', 0, "
            "'typed-dict', 'user'), 'msg': 'Extra inputs are not permitted'}]",
        },
        (),
    ),
    "an invalid value": (
        400,
        _openai("Invalid value for 'presence_penalty': must be <= 2.", "presence_penalty"),
        (),
    ),
    "not sent": (400, _openai("Unrecognized request argument supplied: seed"), ()),
    "context overflow": (
        400,
        _openai("This model's maximum context length is 8192 tokens.", "messages"),
        (),
    ),
    "a 500": (500, _openai("Unrecognized request argument supplied: user"), ()),
    "not json": (400, "Unsupported param: user", ("user",)),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_rejected_params(case: str) -> None:
    status, body, expected = SHAPES[case]
    raw = body.encode() if isinstance(body, str) else orjson.dumps(body)
    assert rejected_params(status, raw, SENT) == expected


def test_without_drops_and_renames() -> None:
    body = {"model": "m", "user": "a", "max_completion_tokens": 5}
    assert without(body, frozenset({"user", "max_completion_tokens"})) == {
        "model": "m",
        "max_tokens": 5,
    }
    both = frozenset({"max_tokens", "max_completion_tokens"})
    assert without(body, both) == {"model": "m", "user": "a"}
    assert without(body, frozenset()) is body
