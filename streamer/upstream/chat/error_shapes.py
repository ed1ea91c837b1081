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
        "exceed_context_size_error",  # llama.cpp server (real-backends.md: its 400)
        "context_length_exceeded",  # OpenAI (its `code`), LiteLLM, OpenRouter
        "context_window_exceeded",
        "1261",  # z.ai / Zhipu GLM: "Prompt exceeds max length" (zeroclaw-labs/zeroclaw#4124)
    }
)
# Lower-case phrases in the message that mean the same.
_OVERFLOW_PHRASES = (
    # vLLM, OpenAI, DeepSeek, OpenRouter: "This model's maximum context length is N tokens.
    # However, you requested M tokens" (langchain-ai/langchain#24058)
    "maximum context length",
    # llama.cpp: "the request exceeds the available context size, try increasing it"
    "exceeds the available context size",
    "exceed_context_size",
    # SGLang: "The input (N tokens) is longer than the model's context length (M tokens)."
    "longer than the model's context length",
    "context length exceeded",
    # Ollama: "the input length exceeds the context length" (400; embeddings and runners
    # that do not truncate); its chat endpoints otherwise truncate the prompt silently
    # (ollama/ollama#2208), so the next phrases are other Ollama-based servers' wording
    "input length exceeds the context length",
    "exceeds maximum context length",
    "exceeded max context length",
    "prompt too long",
    # Kimi (Moonshot): "Invalid request: Your request exceeded model token limit: 262144
    # (requested: 269030)" (MoonshotAI/kimi-cli#2011)
    "exceeded model token limit",
    "prompt exceeds max length",  # GLM, with code 1261
    "context window",
)
# Lower-case phrases of a 5xx that is a deterministic rejection of the request: sent
# again it fails again, so it is the client's (4xx), with the backend's message.
_REJECTION_PHRASES = (
    # llama.cpp, replayed arguments that are not JSON (a 500; seen against a real
    # llama-server, issue 15)
    "failed to parse tool call arguments",
    "image input is not supported",  # llama.cpp without --mmproj (a 500, the same)
    "does not support image",
    "is not a multimodal model",  # vLLM, an image to a text-only model
    "does not support multimodal",
    "missing data required for image input",  # Ollama, an image to a text-only model
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
