"""The backend kinds, one row each (streamer/upstream/kind.py): the only list of them.

A new kind is a package under `streamer/upstream/` with its row, and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.upstream.anthropic.kind import ANTHROPIC
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.kind import BackendKind
from streamer.upstream.responses.kind import RESPONSES

KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (CHAT, RESPONSES, ANTHROPIC)}
NAMES = tuple(KINDS)  # as the module was loaded (readers of the list read KINDS)


def kind_named(name: str) -> BackendKind:
    """The kind `--upstream-api name` (or a model's `api`) names (a ValueError for another)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown --upstream-api {name!r} (one of {', '.join(KINDS)})") from None


def recorded_kind(sent: Any) -> BackendKind:
    """The kind a recorded backend request was lowered for (Chat when none says so)."""
    if isinstance(sent, Mapping):
        for kind in sorted(KINDS.values(), key=lambda k: k is CHAT):  # Chat's test is the widest
            if kind.recorded(sent):
                return kind
    return CHAT
