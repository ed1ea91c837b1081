"""What a Responses backend takes of a request's tools, as data (pure).

One row per `--backend-profile` (streamer/upstream/responses/profiles.py); the lowering for
`--upstream-api responses` (streamer/core/responses_lowering.py) reads it, never a name.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKEND_BLOB = "backend_encrypted_content"
"""Where an opened reasoning item (streamer/core/compaction.py `restore`) carries the Responses
backend's own `encrypted_content`, sealed in the gateway's, to the lowering."""


@dataclass(frozen=True, slots=True)
class BackendTools:
    """Which tool forms a Responses backend takes as they are."""

    namespaces: bool = False
    """`{"type": "namespace"}` tools (OpenAI); else flattened with the naming core."""
    custom: bool = False
    """`{"type": "custom"}` tools (free-form input); else a function of one string `input`."""
    hosted: frozenset[str] = frozenset()
    """Hosted tool types the backend runs itself (`web_search`, …); others are left out (and a
    `tool_choice` that forces one is a 400)."""
    reasoning_input: bool = True
    """Readable reasoning items in `input` (vLLM, llama.cpp); else they are left out."""
    encrypted_reasoning: bool = False
    """It returns `encrypted_content` on reasoning items when asked (`include`)."""


FLAT = BackendTools()
"""Every tool a function (flattened with the naming core): what every backend takes."""
