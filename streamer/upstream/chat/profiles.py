"""Backend profiles: what each Chat Completions backend accepts, as data (pure).

A profile is a row of settings that the lowering (`LoweringOptions`) and the Chat client
apply; the code has no per-backend branches. `--backend-profile` picks the row, and each
setting can be overridden by its own flag (`resolve`). `generic` is safe for all of them:
a narrowed `"required"` instead of a named tool_choice object, one leading system
message, the three reasoning efforts every reasoning backend takes, no `user`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from streamer.core.backend_tools import FLAT, BackendTools
from streamer.core.lowering import LoweringOptions
from streamer.core.request_fields import OPTIONAL_PARAMS

SystemPolicy = Literal["merge", "keep", "user"]
SYSTEM_POLICIES: tuple[SystemPolicy, ...] = ("merge", "keep", "user")
ReasoningReplay = Literal["reasoning_content", "reasoning", "off"]
REASONING_REPLAYS: tuple[ReasoningReplay, ...] = ("reasoning_content", "reasoning", "off")

_THREE = ("low", "medium", "high")
# `logprobs`/`top_logprobs` are Chat Completions' own; every backend here takes them or
# ignores them (the answer then carries none).
_LOGPROBS = frozenset({"logprobs"})


@dataclass(frozen=True, slots=True)
class BackendProfile:
    name: str
    tool_choice_object: bool = False
    """Sends a forced single tool as `{"type":"function","function":{"name":…}}`; else
    `"required"` with the tool list narrowed to it (works on every backend)."""
    required_choice: bool = True
    """Sends `"required"` when a call is forced; else `"auto"` over the narrowed list."""
    efforts: tuple[str, ...] | None = _THREE
    """The `reasoning_effort` values the backend takes (None: any; (): never send it)."""
    system_messages: SystemPolicy = "merge"
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    drop: frozenset[str] = frozenset({"user"})
    """Chat parameters never sent to this backend (`stream_options`: no usage asked)."""
    file_parts: bool = True
    """Takes Chat `file` content parts (`file_data`/`file_id` + `filename`); else an
    `input_file` in the request is a 400 (generic passes them on: the backend decides).
    OpenAI: the Chat `file` part (platform.openai.com/docs/guides/pdf-files); OpenRouter:
    PDFs as `file` parts (openrouter.ai/docs/features/multimodal/pdfs); llama.cpp, vLLM and
    Ollama take images but no `file` part type."""
    reasoning_replay: ReasoningReplay = "reasoning_content"
    """The assistant message field that earlier turns' readable reasoning goes back in
    (`off`: not replayed). DeepSeek, Kimi and GLM reject a tool loop without it."""
    accepts: frozenset[str] = _LOGPROBS
    """Optional Chat parameters the backend takes (streamer/core/request_fields.py):
    `logprobs`, `verbosity`, `service_tier`, `metadata`, and a cache hint named
    `prompt_cache_key` or `cache_salt`; a request field it does not take is not sent."""
    tokenizer: str | None = None
    """How the backend counts a prompt's tokens (a row of `tokenize.TOKENIZERS`), for
    `/v1/responses/input_tokens`; None: the count is estimated."""


PROFILES: dict[str, BackendProfile] = {
    p.name: p
    for p in (
        # Every setting at its safe value; see the module docstring. Replayed reasoning goes
        # in `reasoning_content`, the field DeepSeek defined (api-docs.deepseek.com
        # guides/thinking_mode, "Tool Calls") and llama.cpp reads back.
        BackendProfile("generic"),
        # api.openai.com: named tool_choice objects, `max_completion_tokens` (`max_tokens` is
        # deprecated and rejected by o-series models: "Unsupported parameter: 'max_tokens'
        # ... Use 'max_completion_tokens' instead"), efforts none…xhigh per model
        # (platform.openai.com/docs/api-reference/chat/create, "reasoning_effort"); system
        # and developer messages anywhere. Its reasoning is encrypted, never readable text,
        # so none is replayed.
        BackendProfile(
            "openai",
            tool_choice_object=True,
            efforts=("none", "minimal", "low", "medium", "high", "xhigh"),
            system_messages="keep",
            max_tokens_field="max_completion_tokens",
            drop=frozenset(),
            file_parts=True,
            reasoning_replay="off",
            # chat/create takes logprobs, verbosity, service_tier, metadata, prompt_cache_key
            accepts=frozenset(
                {"logprobs", "verbosity", "service_tier", "metadata", "prompt_cache_key"}
            ),
        ),
        # vLLM: reasoning_effort is Literal["low","medium","high"] in its ChatCompletionRequest
        # (vllm/entrypoints/openai/protocol.py); a named tool_choice is honoured through
        # guided decoding (docs.vllm.ai "Tool Calling", "Named Function Calling"); takes
        # `user`. Replayed reasoning is read from `reasoning` only: `reasoning_content` on
        # an input message is silently dropped (vllm-project/vllm#27752 renamed the field,
        # #38488 the input side that only reads `reasoning`).
        BackendProfile(
            "vllm",
            tool_choice_object=True,
            drop=frozenset(),
            reasoning_replay="reasoning",
            file_parts=False,
            tokenizer="vllm",
        ),
        # SGLang: named tool_choice through constrained decoding (docs.sglang.ai "Tool
        # Parser"); reasoning_effort low/medium/high, and replayed reasoning read from the
        # assistant message's `reasoning_content` (ChatCompletionMessageGenericParam in
        # sglang/srt/entrypoints/openai/protocol.py).
        BackendProfile("sglang", tool_choice_object=True, tokenizer="sglang"),
        # llama.cpp server: tool_choice must be a string; an object logs "Wrong type supplied
        # for parameter 'tool_choice'" and falls back to auto (seen against a real
        # llama-server, issue 15 and ../shared/notes/real-backends.md); Qwen/Llama chat
        # templates reject a system message that is not first; `reasoning_content` read back.
        BackendProfile("llamacpp", file_parts=False, tokenizer="llamacpp"),
        # Ollama: reasoning_effort must be "high", "medium", "low" or "none" ("invalid
        # reasoning value" otherwise), and replayed reasoning is read from `reasoning`
        # (Message.Reasoning -> the message's thinking): ollama/ollama openai/openai.go,
        # FromChatRequest. No tool_choice object (docs.ollama.com/openai, "Supported request
        # fields").
        BackendProfile(
            "ollama",
            efforts=("none", "low", "medium", "high"),
            reasoning_replay="reasoning",
            file_parts=False,
        ),
        # LM Studio: tool_choice "none" | "auto" | "required" only, no named object
        # (lmstudio.ai/docs/app/api/tools).
        BackendProfile("lmstudio"),
        # Anthropic and LiteLLM: named for their Messages rows (`--upstream-api anthropic`,
        # streamer/upstream/anthropic/profiles.py); their Chat Completions endpoints (Claude's
        # OpenAI compatibility, LiteLLM's proxy) take what generic sends.
        BackendProfile("anthropic"),
        BackendProfile("litellm"),
        # DeepSeek: reasoning_effort minimal…max accepted and mapped (minimal/low -> low,
        # medium/high/xhigh -> high, max) by api-docs.deepseek.com guides/thinking_mode;
        # in thinking mode every earlier tool-call turn's `reasoning_content` must come back
        # ("Missing `reasoning_content` field in the assistant message at message index N",
        # a 400: continuedev/continue#9913); a `developer` role is refused ("unknown variant
        # `developer`, expected one of `system`, `user`, `assistant`, `tool`",
        # decolua/9router#773), so system/developer messages are merged into one.
        BackendProfile("deepseek", efforts=("minimal", "low", "medium", "high", "xhigh", "max")),
        # Kimi (Moonshot): thinking models stream and read back `reasoning_content`, which a
        # tool loop must replay ("thinking is enabled but reasoning_content is missing in
        # assistant tool call message", looplj/axonhub#1755); no reasoning_effort in its
        # Chat API (platform.moonshot.ai docs), so none is sent.
        # A forced tool_choice ("required" or named) with thinking on is a 400 "tool_choice
        # '...' is incompatible with thinking enabled" (probed in harn-vm's capability
        # sources, 35-moonshot.toml): "auto" over the narrowed list instead.
        BackendProfile("kimi", efforts=(), required_choice=False),
        # GLM (Zhipu / z.ai): thinking is switched with `thinking: {type: enabled}`, not
        # reasoning_effort, and interleaved thinking wants "thinking blocks explicitly
        # preserved and returned together with the tool results" (docs.z.ai guides/
        # capabilities/thinking-mode), as `reasoning_content`.
        # tool_choice: only "auto" (docs.bigmodel.cn / docs.z.ai function calling; forced
        # choices are degraded to auto by agentscope's GLM formatter, java.agentscope.io).
        BackendProfile("glm", efforts=(), required_choice=False),
        # OpenRouter: reasoning effort "xhigh", "high", "medium", "low", "minimal" or "none",
        # normalised across providers (openrouter.ai/docs/guides/best-practices/
        # reasoning-tokens); tool_choice objects passed on; reasoning goes back as the
        # assistant message's `reasoning` (same page, "Preserving reasoning blocks").
        BackendProfile(
            "openrouter",
            tool_choice_object=True,
            efforts=("none", "minimal", "low", "medium", "high", "xhigh"),
            drop=frozenset(),
            file_parts=True,
            reasoning_replay="reasoning",
            # its request schema takes logprobs and metadata (openrouter.ai/docs/api-reference)
            accepts=frozenset({"logprobs", "metadata"}),
        ),
    )
}


def _efforts(text: str) -> tuple[str, ...] | None:
    text = text.strip()
    if text == "any":
        return None
    return tuple(e.strip() for e in text.split(",") if e.strip())


def _names(text: str) -> frozenset[str]:
    return frozenset(p.strip() for p in text.split(",") if p.strip())


def _system(value: str) -> str:
    if value not in SYSTEM_POLICIES:
        raise ValueError(f"--system-messages must be merge, keep or user (got {value!r})")
    return value


def _max_tokens_field(value: str) -> str:
    if value not in ("max_tokens", "max_completion_tokens"):
        raise ValueError("--max-tokens-field must be max_tokens or max_completion_tokens")
    return value


def _replay(value: str) -> str:
    if value not in REASONING_REPLAYS:
        raise ValueError(
            f"--reasoning-replay must be reasoning_content, reasoning or off (got {value!r})"
        )
    return value


def _accepts(text: str) -> frozenset[str]:
    taken = _names(text)
    unknown = taken - OPTIONAL_PARAMS
    if unknown:
        raise ValueError(
            f"--backend-accepts: unknown parameter(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(OPTIONAL_PARAMS))})"
        )
    return taken


_READERS: dict[str, Callable[[Any], Any]] = {
    "system_messages": _system,
    "efforts": _efforts,
    "max_tokens_field": _max_tokens_field,
    "drop": _names,
    "reasoning_replay": _replay,
    "accepts": _accepts,
}
"""How a setting's value becomes a profile field's (the others are taken as they are)."""


def resolve(name: str, **given: Any) -> BackendProfile:
    """The profile `name` with each given field (a setting's value, None: not given) laid
    over it; a setting's text is read into the field's type (streamer/config.py declares
    which setting overrides which field)."""
    profile = PROFILES.get(name)
    if profile is None:
        raise ValueError(f"unknown --backend-profile {name!r} (one of {', '.join(PROFILES)})")
    read = {
        key: _READERS.get(key, _same)(value) for key, value in given.items() if value is not None
    }
    return replace(profile, **read) if read else profile


def _same(value: Any) -> Any:
    return value


_LOWERED = tuple(
    f.name for f in fields(LoweringOptions) if f.name in BackendProfile.__dataclass_fields__
)
"""The profile's fields the lowering takes as they are (same name, same meaning)."""


def lowering_options(
    profile: BackendProfile, *, model: str | None, tools: BackendTools = FLAT
) -> LoweringOptions:
    """The lowering this profile asks for (`stream_options` is the client's to drop), with
    the tool forms the backend's kind takes on it (`tools`)."""
    replay = profile.reasoning_replay
    return LoweringOptions(
        model=model,
        replay_reasoning=replay != "off",
        reasoning_field="reasoning_content" if replay == "off" else replay,
        profile=profile.name,
        tools=tools,
        **{name: getattr(profile, name) for name in _LOWERED},
    )
