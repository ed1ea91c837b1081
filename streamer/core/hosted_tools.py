"""Hosted tools the gateway cannot run: told, never dropped in silence (pure).

OpenAI runs web search, file search, the code interpreter, image generation and computer use
itself; a backend that does not (every Chat and Messages backend, a Responses backend whose
`--backend-profile` lacks them) cannot. A request offering one is a 400 naming it, unless
its type is one the operator lets pass (`--optional-hosted-tools`, by default `web_search`,
which Codex and other clients offer with every request): then it is left out for the
backend, echoed to the client, and the log says so. `mcp` is not among them: the gateway
runs remote MCP servers itself (streamer/mcp/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamer.core.errors import invalid

HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer",
        "computer_use",
        "computer_use_preview",
    }
)
"""The hosted tool types OpenAI runs and this gateway cannot."""


def check(tools: Sequence[Any], runs: frozenset[str], optional: frozenset[str]) -> list[str]:
    """The hosted tools of `tools` left out for the backend (of an `optional` type); a 400
    naming the first one that is neither run by the backend (`runs`) nor optional."""
    left_out: list[str] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if not isinstance(kind, str) or kind not in HOSTED or kind in runs:
            continue
        if kind in optional:
            left_out.append(kind)
            continue
        raise invalid(
            f"The hosted tool {kind!r} is not available here: this gateway cannot run it and "
            "its backend does not (--backend-profile). Remove it from 'tools', or ask the "
            "operator to list it in --optional-hosted-tools to have it left out.",
            f"tools[{i}]",
            "unsupported_tool",
        )
    return left_out
