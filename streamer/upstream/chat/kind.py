"""The Chat Completions kind's row (`--upstream-api chat`, the default): lowered by
streamer/core/lowering.py, `POST {base}/chat/completions` always streamed (usage asked for
unless the profile drops `stream_options`), read by `ChatDecoder`, a whole JSON completion
by `decode_body`; `tap` reads its chunks with `ChatChunkDecoder`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import orjson

from streamer.core.backend_tools import FLAT
from streamer.core.compaction import compaction_request
from streamer.core.lowering import lower
from streamer.upstream.chat.decoder import ChatChunkDecoder
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.chat.stream import ChatDecoder, decode_body
from streamer.upstream.kind import BackendKind, Body, TapReading

PATH = "/chat/completions"


def streaming(stream_usage: bool, backend_request: dict[str, Any]) -> dict[str, Any]:
    """The request as sent: always streamed, with usage asked for unless the profile
    drops `stream_options` (a backend that rejects it)."""
    body = dict(backend_request)
    body["stream"] = True
    options = body.get("stream_options")
    if stream_usage:
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    else:
        body.pop("stream_options", None)
    return body


def _body(profile: BackendProfile) -> Body:
    """Usage asked for unless the profile drops `stream_options`."""
    return partial(streaming, "stream_options" not in profile.drop)


def looks_like_chat(data: str) -> bool:
    """A stream's first data payload is a Chat Completions chunk (or `[DONE]`)."""
    if data.strip() == "[DONE]":
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(obj, dict) or isinstance(obj.get("type"), str):
        return False
    return "choices" in obj or str(obj.get("object", "")).startswith("chat.completion")


def _recorded(sent: Mapping[str, Any]) -> bool:
    return "messages" in sent


CHAT = BackendKind(
    name="chat",
    path=PATH,
    lower=lower,
    compaction=compaction_request,
    prompt_keys=("messages", "tools"),
    tools=lambda profile: FLAT,  # Chat Completions has function tools only
    body=_body,
    decoder=ChatDecoder,
    decode_whole=decode_body,
    recorded=_recorded,
    tap=TapReading("chat-sse", looks_like_chat, ChatChunkDecoder),
    embedded=True,
    resuming=lower,
)
