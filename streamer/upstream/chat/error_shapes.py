"""What backends' error messages mean, as data (pure).

Backends say "the prompt is longer than the context" each in their own words, and some
answer a request they will never accept with a 500. These tables name the shapes; the
decoder maps an error that matches to the code or status clients act on.
"""

from __future__ import annotations

CONTEXT_OVERFLOW = "context_length_exceeded"

# `type`/`code` values that mean the prompt does not fit the context, by backend.
_OVERFLOW_KINDS = frozenset(
    {
        "exceed_context_size_error",  # llama.cpp server
        "context_length_exceeded",  # OpenAI, LiteLLM, OpenRouter
        "context_window_exceeded",
    }
)
# Lower-case phrases in the message that mean the same.
_OVERFLOW_PHRASES = (
    "maximum context length",  # vLLM, OpenAI
    "exceeds the available context size",  # llama.cpp
    "exceed_context_size",
    "longer than the model's context length",  # SGLang
    "context length exceeded",
    "exceeds maximum context length",  # Ollama
    "exceeded max context length",  # Ollama
    "prompt too long",  # Ollama
    "context window",
)
# Lower-case phrases of a 5xx that is a deterministic rejection of the request: sent
# again it fails again, so it is the client's (4xx), with the backend's message.
_REJECTION_PHRASES = (
    "failed to parse tool call arguments",  # llama.cpp, arguments in history not JSON
    "image input is not supported",  # llama.cpp without mmproj
    "does not support image",
    "is not a multimodal model",  # vLLM
    "does not support multimodal",
    "missing data required for image input",  # Ollama
)


def is_context_overflow(kind: str | None, message: str) -> bool:
    """`kind` (the error's `type` or `code`) or `message` says the prompt is too long."""
    if kind and kind.lower() in _OVERFLOW_KINDS:
        return True
    lower = message.lower()
    return any(phrase in lower for phrase in _OVERFLOW_PHRASES)


def is_rejection(message: str) -> bool:
    """A backend's 5xx `message` names a request it will never accept."""
    lower = message.lower()
    return any(phrase in lower for phrase in _REJECTION_PHRASES)
