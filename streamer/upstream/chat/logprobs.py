"""Chat Completions token log probabilities -> the Responses shape (pure).

A Chat choice carries them as `logprobs: {"content": [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}` (OpenAI, vLLM, SGLang, llama.cpp); Responses
wants the same entries as a list on `output_text` (`ResponseOutputText.Logprob`). An entry
that is not of that shape is left out; `bytes` missing or null is the token's UTF-8.
"""

from __future__ import annotations

from typing import Any


def choice_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The content tokens' log probabilities of one Chat choice (or [] when it has none)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return []
    content = logprobs.get("content")
    if not isinstance(content, list):
        return []
    out = []
    for entry in content:
        token = _entry(entry)
        if token is not None:
            top = entry.get("top_logprobs")
            alternatives = [_entry(t) for t in top] if isinstance(top, list) else []
            token["top_logprobs"] = [t for t in alternatives if t is not None]
            out.append(token)
    return out


def _entry(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, dict):
        return None
    token, logprob = entry.get("token"), entry.get("logprob")
    if not isinstance(token, str) or isinstance(logprob, bool):
        return None
    if not isinstance(logprob, int | float):
        return None
    raw = entry.get("bytes")
    if not (isinstance(raw, list) and all(_byte(b) for b in raw)):
        raw = list(token.encode("utf-8", "surrogatepass"))
    return {"token": token, "logprob": float(logprob), "bytes": raw}


def _byte(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255
