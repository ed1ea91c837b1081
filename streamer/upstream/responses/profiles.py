"""Responses backends' tool capabilities by `--backend-profile` name (data, no branches).

- openai: namespace, custom and hosted tools natively; reasoning kept as its encrypted blob.
- vllm, sglang, lmstudio: namespace tools are rejected or mishandled (vLLM's harmony models
  reject them, LM Studio rejects `namespace`): flattened; custom tools lowered to functions.
- llamacpp: `/v1/responses` skips every non-function tool: everything is a function.
- ollama: takes namespace tools but answers with `ns.name` (decoded through the map's dotted
  spellings); custom tools lowered.
- generic (and any other name): everything a function (safe for all).
"""

from __future__ import annotations

from streamer.core.backend_tools import FLAT, BackendTools

HOSTED_OPENAI = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "mcp",
        "tool_search",
    }
)

PROFILES: dict[str, BackendTools] = {
    "openai": BackendTools(
        namespaces=True,
        custom=True,
        hosted=HOSTED_OPENAI,
        reasoning_input=False,
        encrypted_reasoning=True,
    ),
    "vllm": FLAT,
    "sglang": FLAT,
    "lmstudio": FLAT,
    "llamacpp": FLAT,
    "ollama": BackendTools(namespaces=True),
    "generic": FLAT,
}


def backend_tools(profile: str) -> BackendTools:
    """The row of `--backend-profile` (`generic`'s for a profile with no Responses row)."""
    return PROFILES.get(profile, FLAT)
