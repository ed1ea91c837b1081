"""Reasoning items in odd shapes are tolerated as sent, by every reader of their parts
(the WebSocket fuzz test found a `content` that is a number reaching the unsealing code)."""

from __future__ import annotations

import orjson
import pytest

from streamer.core.compaction import REASONING_FIELD, restore
from streamer.core.deltas import TextDelta
from streamer.core.errors import RequestError
from streamer.core.sealing import Sealer
from streamer.upstream.chat.stream import EndCause
from streamer.upstream.responses.decoder import ResponsesDecoder


@pytest.mark.parametrize("content", [1.5, "text", {"type": "reasoning_text"}])
def test_a_sealed_reasoning_item_with_odd_content_is_opened(content: object) -> None:
    sealer = Sealer.random()
    blob = sealer.seal("reasoning", REASONING_FIELD, "thought")
    item = {"type": "reasoning", "summary": [], "content": content, "encrypted_content": blob}
    (opened,) = restore([item], sealer)
    assert opened["content"] == [{"type": "reasoning_text", "text": "thought"}]


def test_an_odd_item_whose_blob_does_not_open_is_a_400() -> None:
    item = {"type": "reasoning", "summary": [], "content": 1.5, "encrypted_content": "x"}
    with pytest.raises(RequestError) as caught:
        restore([item], Sealer.random())
    assert caught.value.status == 400


def test_a_backend_message_sent_whole_with_odd_content_makes_no_text() -> None:
    def event(obj: dict[str, object]) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (str(obj["type"]).encode(), orjson.dumps(obj))

    done = {"type": "message", "id": "m", "role": "assistant", "content": 7}
    good = {"type": "message", "id": "n", "role": "assistant"}
    good["content"] = [{"type": "output_text", "text": "hi"}]
    body = b"".join(
        [
            event({"type": "response.output_item.done", "output_index": 0, "item": done}),
            event({"type": "response.output_item.done", "output_index": 1, "item": good}),
        ]
    )
    decoder = ResponsesDecoder(300)
    deltas = decoder.feed(body)
    while decoder.pending:
        deltas += decoder.take()
    deltas += decoder.end(EndCause.CLEAN)
    assert [d for d in deltas if isinstance(d, TextDelta)] == [TextDelta("hi")]
