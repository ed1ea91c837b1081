"""The pooled Responses client (`--upstream-api responses`): `POST {base}/responses`.

The Chat client's shell (pools per client, proxy, TLS, timeouts, the whole-JSON budget,
errors mapped with the same codes, the 400-retry without optional parameters it names)
with this API's endpoint and decoders: every request is streamed (`stream: true`) and
stateless at the backend (`store: false`), because the gateway keeps the state (stored
responses, `previous_response_id`, background, the WebSocket mode, compaction).
"""

from __future__ import annotations

from typing import Any

from streamer.upstream.chat.client import ChatStream, ChatUpstream
from streamer.upstream.chat.rejected_params import without
from streamer.upstream.responses.decoder import ResponsesDecoder, decode_response_body


class ResponsesStream(ChatStream):
    """A 2xx answer of a Responses backend: `ChatStream` reading its events."""

    decoder = ResponsesDecoder


class ResponsesUpstream(ChatUpstream):
    """A Responses backend at `base_url` (what the OpenAI SDK would take: `.../v1`)."""

    endpoint = "/responses"
    stream = ResponsesStream
    decode_whole = staticmethod(decode_response_body)

    def __repr__(self) -> str:
        return f"ResponsesUpstream({self._where()!r})"

    def _streaming(self, backend_request: dict[str, Any]) -> dict[str, Any]:
        """The request as sent: streamed, stored nowhere but in the gateway."""
        body = dict(backend_request)
        body["stream"] = True
        body["store"] = False
        body.pop("stream_options", None)
        return without(body, self.rejected)
