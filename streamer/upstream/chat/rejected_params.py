"""Which optional request parameters a backend's error says it does not take (pure).

A backend that does not know a parameter either ignores it or answers 400/422 naming it,
each in its own words. `rejected_params` reads those answers; the Chat client sends the
request again once without what they name, and leaves it out from then on (`without`).

Only the parameters in `DROPPABLE` are ever named: tuning and bookkeeping the client can
do without. `messages`, `tools`, `tool_choice`, `model`, `response_format` are never
dropped: without them the answer would not be the one the client asked for, so their 400
passes through as it came. The names are also only ever this fixed set, so what a
gateway remembers per backend is bounded by it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import orjson

DROPPABLE = frozenset(
    {
        "stream_options",  # usage is then estimated
        "parallel_tool_calls",  # the gateway keeps only the first call itself
        "user",
        "reasoning_effort",
        "max_completion_tokens",  # renamed, not dropped (RENAMES)
        "max_tokens",
        "metadata",
        "service_tier",
        "store",
        "logprobs",
        "top_logprobs",
        "frequency_penalty",
        "presence_penalty",
        "prompt_cache_key",
        "safety_identifier",
        "seed",
    }
)
RENAMES = {"max_completion_tokens": "max_tokens", "max_tokens": "max_completion_tokens"}
"""A rejected name whose value goes on under the other (unless that is rejected too)."""

_NAME = r"['\"`]?([A-Za-z_][A-Za-z0-9_]*)"
# Each names one top-level parameter, in a backend's own words (case-insensitive).
_NAMED = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"unrecognized request arguments? supplied:\s*" + _NAME,  # OpenAI, Azure
        r"unsupported param(?:eter)?s?(?:\(s\))?:\s*" + _NAME,  # OpenAI, llama.cpp, z.ai
        r"does not support the parameter\s+" + _NAME,  # DeepSeek
        r"unknown name \"([A-Za-z_][A-Za-z0-9_]*)\": cannot find field",  # Gemini (top level)
        r"unknown (?:field|parameter|argument)s?:?\s+" + _NAME,  # serde, Go, others
        _NAME + r"['\"`]? (?:parameter )?is not (?:supported|permitted|allowed)",
        # pydantic (vLLM, SGLang, TGI, Mistral), stringified into the message
        r"'type': 'extra_forbidden', 'loc': \('body', '([A-Za-z_][A-Za-z0-9_]*)'\)",
    )
)
# A phrase that names no parameter but means one (lower case).
_MEANS = (("does not support thinking", "reasoning_effort"),)  # Ollama, a model without it
_UNSUPPORTED_WORDS = ("unsupported", "not supported", "unrecognized", "unknown", "not permitted")
_UNSUPPORTED_CODES = frozenset({"unsupported_parameter", "unknown_parameter"})
_MAX_STRINGS = 256  # strings of an error body looked at (the body is cut at 1 MiB already)


def rejected_params(status: int, raw: bytes, sent: Mapping[str, Any]) -> tuple[str, ...]:
    """The droppable parameters of `sent` that a `status` answer with body `raw` says the
    backend does not take, in the order named; () if it names none of them."""
    if status not in (400, 422):
        return ()
    try:
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = raw.decode("utf-8", "replace")
    names: list[str] = []
    for name in _named(parsed):
        if name in DROPPABLE and name in sent and name not in names:
            names.append(name)
    return tuple(names)


def without(body: dict[str, Any], rejected: Collection[str]) -> dict[str, Any]:
    """`body` with each `rejected` parameter left out, or sent under its other name."""
    if not rejected:
        return body
    out = dict(body)
    for name in rejected:
        if name not in out:
            continue
        value = out.pop(name)
        other = RENAMES.get(name)
        if other is not None and other not in rejected and other not in out:
            out[other] = value
    return out


def _named(parsed: Any) -> Iterator[str]:
    """Every parameter name the error body names as not taken."""
    for text in _strings(parsed):
        for pattern in _NAMED:
            yield from pattern.findall(text)
        lower = text.lower()
        yield from (name for phrase, name in _MEANS if phrase in lower)
    for obj in _objects(parsed):
        yield from _structured(obj)


def _structured(obj: Mapping[str, Any]) -> Iterator[str]:
    """FastAPI's `{"type": "extra_forbidden", "loc": ["body", name]}`, and an OpenAI error
    whose `param` is the parameter and whose code or message says it is not supported."""
    loc = obj.get("loc")
    if obj.get("type") == "extra_forbidden" and isinstance(loc, list) and len(loc) == 2:
        where, name = loc
        if where == "body" and isinstance(name, str):
            yield name
    param = obj.get("param")
    if isinstance(param, str):
        message = obj.get("message")
        said = isinstance(message, str) and any(w in message.lower() for w in _UNSUPPORTED_WORDS)
        if said or obj.get("code") in _UNSUPPORTED_CODES:
            yield param


def _strings(value: Any) -> Iterator[str]:
    """The strings in a JSON value (depth-first, at most `_MAX_STRINGS`)."""
    stack, seen = [value], 0
    while stack and seen < _MAX_STRINGS:
        item = stack.pop()
        if isinstance(item, str):
            seen += 1
            yield item
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _objects(value: Any) -> Iterator[Mapping[str, Any]]:
    """The objects in a JSON value (depth-first, bounded as `_strings`)."""
    stack, seen = [value], 0
    while stack and seen < _MAX_STRINGS:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            yield item
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))
