"""What each `/v1/messages` implementation takes, by `--backend-profile` name (data, no
branches): the lowering (streamer/upstream/anthropic/request.py) reads a row, never a name.

- anthropic (api.anthropic.com): signed thinking with a token budget per effort, or adaptive
  thinking (`thinking: {type: adaptive}` + `output_config.effort`) for the models that take
  only that (platform.claude.com docs, "Adaptive thinking": Opus 4.6 and later; budgets are
  refused with a 400 on Opus 4.7 and later); prompt caching with `cache_control`
  breakpoints; structured outputs as `output_config.format`; PDF `document` blocks.
- litellm: a proxy, most often in front of Claude: Anthropic's row without adaptive models
  (it forwards what it is sent).
- llamacpp (llama-server's `/v1/messages`, tools/server/server-chat.cpp
  `server_chat_convert_anthropic_to_oai`): `thinking.budget_tokens` becomes its thinking
  budget; thinking blocks come back unsigned (`signature: ""`) and are read back as
  `reasoning_content`; no `output_config`, no documents, no prompt cache breakpoints.
- vllm (vllm/entrypoints/anthropic/protocol.py): no `thinking` field (thinking is the chat
  template's), `output_config.format` taken, content blocks text/image/tool only.
- generic (and any other name): Anthropic's wire as documented, safe for all: budgets,
  breakpoints (ignored where not honoured) and `output_config`, no documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ThinkingStyle = Literal["budget", "none"]
VERSION = "2023-06-01"  # the `anthropic-version` every implementation takes
BUDGETS: tuple[tuple[str, int], ...] = (
    ("minimal", 1024),
    ("low", 4096),
    ("medium", 8192),
    ("high", 16384),
    ("xhigh", 32768),
    ("max", 65536),
)
"""`reasoning.effort` -> `thinking.budget_tokens` (1024 is the API's least budget)."""
ADAPTIVE_EFFORTS = ("low", "medium", "high", "max")  # output_config.effort (OutputConfigParam)
_ADAPTIVE_MODELS = (
    "claude-opus-4-6",
    "claude-sonnet-4-6",
    "claude-opus-4-7",
    "claude-mythos",
    "claude-fable",
    "claude-opus-5",
    "claude-sonnet-5",
    "claude-haiku-5",
)


@dataclass(frozen=True, slots=True)
class MessagesProfile:
    name: str
    thinking: ThinkingStyle = "budget"
    """`budget`: `thinking: {type: enabled, budget_tokens}` from `budgets`; `none`: the
    backend has no thinking switch, nothing is sent."""
    budgets: tuple[tuple[str, int], ...] = BUDGETS
    min_budget: int = 1024
    """A smaller budget (what `max_tokens` leaves) turns thinking off for the request."""
    adaptive_models: tuple[str, ...] = ()
    """Model name prefixes that take adaptive thinking only (effort in `output_config`)."""
    max_tokens: int = 8192
    """`max_tokens` (required) when neither the request nor the model's settings give one."""
    cache_control: bool = True
    """`cache_control` breakpoints are sent (tools, system, the conversation so far)."""
    json_schema: bool = True
    """`text.format` json_schema goes as `output_config.format`; else it is a 400."""
    documents: bool = False
    """PDF `input_file` parts go as `document` blocks; else a note in the text."""
    signed_thinking: bool = True
    """Thinking is signed and read back only with its signature: reasoning the gateway holds
    no signed block for is left out; else it goes back as an unsigned thinking block."""

    def adaptive(self, model: str | None) -> bool:
        return bool(model) and any(str(model).startswith(p) for p in self.adaptive_models)


PROFILES: dict[str, MessagesProfile] = {
    p.name: p
    for p in (
        MessagesProfile("generic"),
        MessagesProfile(
            "anthropic", max_tokens=32000, documents=True, adaptive_models=_ADAPTIVE_MODELS
        ),
        MessagesProfile("litellm", documents=True),
        MessagesProfile(
            "llamacpp",
            max_tokens=4096,  # what llama-server uses when max_tokens is absent
            cache_control=False,
            json_schema=False,
            signed_thinking=False,
        ),
        MessagesProfile("vllm", thinking="none", cache_control=False, signed_thinking=False),
    )
}


def messages_profile(name: str) -> MessagesProfile:
    """The row of `--backend-profile` (`generic`'s for a profile with no Messages row)."""
    return PROFILES.get(name, PROFILES["generic"])
