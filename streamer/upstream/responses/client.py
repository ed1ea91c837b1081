"""The Responses kind's client (`--upstream-api responses`): the shared client
(streamer/upstream/backend_client.py) over this API's wire (the kind's row, kind.py):
`POST {base}/responses`, every request streamed (`stream: true`) and stateless at the
backend (`store: false`), because the gateway keeps the state (stored responses,
`previous_response_id`, background, the WebSocket mode, compaction); the events read by
`ResponsesDecoder`, a whole Response by `decode_response_body`.
"""

from __future__ import annotations

from typing import Any

from streamer.upstream.backend_client import BackendClient
from streamer.upstream.chat.profiles import PROFILES, BackendProfile
from streamer.upstream.responses.kind import RESPONSES


def responses_client(
    base_url: str, *, profile: BackendProfile = PROFILES["generic"], **options: Any
) -> BackendClient:
    """A Responses backend at `base_url` (`.../v1`); `options` are `BackendClient`'s."""
    return BackendClient(base_url, RESPONSES.wire(profile), **options)
