"""Backend profiles: what each Chat Completions backend accepts, as data (pure).

A profile is a row of settings that the lowering (`LoweringOptions`) and the Chat client
apply; the code has no per-backend branches. `--backend-profile` picks the row, and each
setting can be overridden by its own flag (`resolve`). `generic` is safe for all of them:
a narrowed `"required"` instead of a named tool_choice object, one leading system
message, the three reasoning efforts every reasoning backend takes, no `user`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from streamer.core.lowering import LoweringOptions

SystemPolicy = Literal["merge", "keep", "user"]
SYSTEM_POLICIES: tuple[SystemPolicy, ...] = ("merge", "keep", "user")

_THREE = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class BackendProfile:
    name: str
    tool_choice_object: bool = False
    """Sends a forced single tool as `{"type":"function","function":{"name":…}}`; else
    `"required"` with the tool list narrowed to it (works on every backend)."""
    efforts: tuple[str, ...] | None = _THREE
    """The `reasoning_effort` values the backend takes (None: any; (): never send it)."""
    system_messages: SystemPolicy = "merge"
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    drop: frozenset[str] = frozenset({"user"})
    """Chat parameters never sent to this backend (`stream_options`: no usage asked)."""
    tokenizer: str | None = None
    """How the backend counts a prompt's tokens (a row of `tokenize.TOKENIZERS`), for
    `/v1/responses/input_tokens`; None: the count is estimated."""


PROFILES: dict[str, BackendProfile] = {
    p.name: p
    for p in (
        # Every setting at its safe value; see the module docstring.
        BackendProfile("generic"),
        # api.openai.com: named tool_choice objects, `max_completion_tokens` (`max_tokens` is
        # deprecated and rejected by o-series models), efforts none…xhigh per model
        # (platform.openai.com/docs/api-reference/chat/create, "reasoning_effort").
        BackendProfile(
            "openai",
            tool_choice_object=True,
            efforts=("none", "minimal", "low", "medium", "high", "xhigh"),
            system_messages="keep",
            max_tokens_field="max_completion_tokens",
            drop=frozenset(),
        ),
        # vLLM: reasoning_effort is Literal["low","medium","high"] in its ChatCompletionRequest
        # (vllm/entrypoints/openai/protocol.py); named tool_choice is honoured through guided
        # decoding (docs.vllm.ai "Tool Calling": named function calling); takes `user`.
        BackendProfile("vllm", tool_choice_object=True, drop=frozenset(), tokenizer="vllm"),
        # SGLang: named tool_choice via constrained decoding (docs.sglang.ai "Tool Parser":
        # tool_choice); reasoning_effort low/medium/high (sglang/srt/entrypoints/openai/protocol.py).
        BackendProfile("sglang", tool_choice_object=True, tokenizer="sglang"),
        # llama.cpp server: tool_choice must be a string, an object logs "Wrong type supplied
        # for parameter 'tool_choice'" and falls back to auto (tools/server/utils.hpp,
        # issue 15 here); Qwen/Llama templates reject a non-leading system message.
        BackendProfile("llamacpp", tokenizer="llamacpp"),
        # Ollama: OpenAI compatibility takes no tool_choice object (docs.ollama.com/openai,
        # "Supported request fields": tool_choice not listed) and reasoning_effort
        # high/medium/low/none (ollama/ollama#12004 "openai: add reasoning_effort").
        BackendProfile("ollama", efforts=("none", "low", "medium", "high")),
        # LM Studio: tool_choice "none"|"auto"|"required" only (lmstudio.ai/docs/app/api/tools).
        BackendProfile("lmstudio"),
        # DeepSeek: no reasoning_effort (reasoner always thinks; api-docs.deepseek.com
        # "Reasoning Model": unsupported parameters), templates want one leading system message.
        BackendProfile("deepseek", efforts=()),
        # Kimi (Moonshot): no reasoning_effort; platform.moonshot.ai docs, tool_choice
        # "required" unsupported on some models, a string is the portable form.
        BackendProfile("kimi", efforts=()),
        # GLM (Zhipu / z.ai): thinking is `thinking: {type: enabled}`, not reasoning_effort
        # (docs.z.ai "Deep Thinking"); tool_choice only "auto" documented.
        BackendProfile("glm", efforts=()),
        # OpenRouter: normalises reasoning effort minimal…high across providers
        # (openrouter.ai/docs/use-cases/reasoning-tokens), passes tool_choice objects on.
        BackendProfile(
            "openrouter",
            tool_choice_object=True,
            efforts=("minimal", "low", "medium", "high"),
            drop=frozenset(),
        ),
    )
}


def _parse_efforts(text: str) -> tuple[str, ...] | None:
    text = text.strip()
    if text == "any":
        return None
    return tuple(e.strip() for e in text.split(",") if e.strip())


def resolve(
    name: str,
    *,
    system_messages: str | None = None,
    tool_choice_object: bool | None = None,
    reasoning_efforts: str | None = None,
    max_tokens_field: str | None = None,
    drop_params: str | None = None,
) -> BackendProfile:
    """The profile `name` with each flag that was given laid over it."""
    profile = PROFILES.get(name)
    if profile is None:
        raise ValueError(f"unknown --backend-profile {name!r} (one of {', '.join(PROFILES)})")
    if system_messages is not None:
        if system_messages not in SYSTEM_POLICIES:
            raise ValueError(
                f"--system-messages must be merge, keep or user (got {system_messages!r})"
            )
        profile = replace(profile, system_messages=system_messages)
    if tool_choice_object is not None:
        profile = replace(profile, tool_choice_object=tool_choice_object)
    if reasoning_efforts is not None:
        profile = replace(profile, efforts=_parse_efforts(reasoning_efforts))
    if max_tokens_field is not None:
        if max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ValueError("--max-tokens-field must be max_tokens or max_completion_tokens")
        profile = replace(profile, max_tokens_field=max_tokens_field)  # type: ignore[arg-type]
    if drop_params is not None:
        dropped = frozenset(p.strip() for p in drop_params.split(",") if p.strip())
        profile = replace(profile, drop=dropped)
    return profile


def lowering_options(
    profile: BackendProfile, *, model: str | None, replay: bool
) -> LoweringOptions:
    """The lowering this profile asks for (`stream_options` is the Chat client's to drop)."""
    return LoweringOptions(
        model=model,
        replay_reasoning=replay,
        max_tokens_field=profile.max_tokens_field,
        system_messages=profile.system_messages,
        tool_choice_object=profile.tool_choice_object,
        efforts=profile.efforts,
        drop=profile.drop,
    )
