"""The Chat Completions kind's client: the shared client (streamer/upstream/backend_client.py)
over Chat's wire (the kind's row, kind.py): `POST {base}/chat/completions`, always streamed
with usage asked for (unless the profile drops `stream_options`), the body read by
`ChatDecoder`, a whole JSON completion by `decode_body`.
"""

from __future__ import annotations

from typing import Any

from streamer.upstream.backend_client import BackendClient
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.chat.profiles import PROFILES, BackendProfile


def chat_client(
    base_url: str, *, profile: BackendProfile = PROFILES["generic"], **options: Any
) -> BackendClient:
    """A Chat Completions backend at `base_url` (what the OpenAI SDK would take: `.../v1`)
    on `profile`; `options` are `BackendClient`'s."""
    return BackendClient(base_url, CHAT.wire(profile), **options)
