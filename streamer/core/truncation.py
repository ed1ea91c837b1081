"""`truncation: "auto"` (pure): which input items to drop when the backend's context overflows.

OpenAI's auto truncation drops items from the beginning of the conversation. Here the
gateway does it on the backend's `context_length_exceeded`, once: the oldest items go first,
never a system/developer message (they stay where they are), never half of a call and its
output (items sharing a `call_id` go together), never the newest item. How much goes is
read from the backend's message when it says (vLLM: "maximum context length is 4096
tokens. However, you requested 5000 tokens (4500 in the messages, 500 in the
completion)"; llama.cpp: "request (5000 tokens) exceeds the available context size (4096
tokens)"), else half; sizes are measured as JSON, as the usage estimate does.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

CONTEXT_OVERFLOW = "context_length_exceeded"
_PINNED_ROLES = ("system", "developer")
DEFAULT_KEEP = 0.5  # the share kept when the backend does not say how far over it is
MARGIN = 0.9  # aim under the limit: sizes in characters only approximate tokens
_LIMIT = re.compile(r"(?:context length is|context size \(|n_ctx\D{0,3})\s*(\d+)", re.I)
_ASKED = re.compile(r"(?:requested|request \(|n_prompt_tokens\D{0,3})\s*(\d+)", re.I)
_IN_MESSAGES = re.compile(r"(\d+) in the messages", re.I)


def keep_share(message: str) -> float:
    """The share of the prompt to keep, from the backend's overflow message (else half)."""
    limit, asked = _LIMIT.search(message), _ASKED.search(message)
    if limit is None or asked is None:
        return DEFAULT_KEEP
    cap, total = int(limit.group(1)), int(asked.group(1))
    messages = _IN_MESSAGES.search(message)
    prompt = int(messages.group(1)) if messages else total
    if prompt <= 0 or total <= cap:
        return DEFAULT_KEEP
    share = (prompt - (total - cap)) / prompt * MARGIN
    return min(MARGIN, max(0.05, share))


def _pinned(item: dict[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") in _PINNED_ROLES


def _units(items: list[dict[str, Any]]) -> list[list[int]]:
    """The droppable units, oldest first: each item alone, but items with one `call_id`
    together (a call and its outputs), at the place of the first."""
    units: list[list[int]] = []
    by_call: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        if _pinned(item):
            continue
        call_id = item.get("call_id")
        if isinstance(call_id, str) and call_id:
            unit = by_call.get(call_id)
            if unit is not None:
                unit.append(index)
                continue
            unit = by_call[call_id] = []
            unit.append(index)
            units.append(unit)
        else:
            units.append([index])
    return units


def truncate(items: list[dict[str, Any]], keep: float) -> list[dict[str, Any]] | None:
    """`items` with the oldest units dropped until about `keep` of their size is left (the
    system/developer messages counted as kept); None when nothing can be dropped."""
    sizes = [len(orjson.dumps(item)) for item in items]
    units = _units(items)
    if len(units) < 2:
        return None
    target = sum(sizes) * keep
    left = sum(sizes)
    dropped: set[int] = set()
    newest = max(i for unit in units for i in unit)
    for unit in units:
        if left <= target or newest in unit:  # the newest item (and its pair) always stays
            break
        dropped.update(unit)
        left -= sum(sizes[i] for i in unit)
    if not dropped:
        return None
    return [item for index, item in enumerate(items) if index not in dropped]
