"""What a backend sends is kept whole (issue 30), each case from a recording of the backend's
stream in tests/fixtures/backends/, played by a scripted backend behind the gateway and read
by the official SDK (its stream accumulator included):

- reasoning: every summary part its own (`summary_index`), the raw reasoning only in
  `content`, on the `/v1/responses` path and the Chat path, and kept apart on replay;
- annotations (`url_citation`) from a Responses backend's events and a Chat backend's
  `delta.annotations`, in the part, in order, with their `annotation_index`;
- a hosted call's own events (`response.web_search_call.*`) name the gateway's item and come
  after its `output_item.added`;
- `error.type` on every failed Response, the backend's own kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DIE, DONE, reasoning_chunks, text_chunks
from scripted_responses_backend import ScriptedResponsesBackend

from streamer.core.deltas import (
    Annotation,
    ForeignEvent,
    ItemAdded,
    ReasoningDelta,
    ReasoningPart,
    TextDelta,
    UpstreamError,
    WholeItem,
)
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.tap.grammar import GrammarChecker
from streamer.upstream.chat.stream import ChatDecoder, EndCause
from streamer.upstream.responses.decoder import ResponsesDecoder

RECORDINGS = Path(__file__).parent / "fixtures" / "backends"
SUMMARY = ["First part.", "**Check** the second."]
RAW = "The user wants a greeting. Say hi."
CITED = "Streamer is a gateway [docs]. It restores namespaces [blog]."
CITATIONS = [
    {"type": "url_citation", "start_index": 22, "end_index": 28,
     "url": "https://example.com/docs", "title": "Docs"},
    {"type": "url_citation", "start_index": 53, "end_index": 59,
     "url": "https://example.com/blog", "title": "Blog"},
]  # fmt: skip


def recording(name: str) -> bytes:
    return (RECORDINGS / name).read_bytes()


def decoded(decoder: ChatDecoder, data: bytes) -> list[Any]:
    out = decoder.feed(data)
    while decoder.pending:
        out += decoder.take()
    return out + decoder.end(EndCause.CLEAN)


def streamed(deltas: list[Any], **request: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events and Response the streamer makes of `deltas` (checked by the tap grammar)."""
    response = new_response({"model": "m", **request})
    streamer = OutputItemStreamer(ResponsesToolNames(), response)
    events = streamer.start() + streamer.feed(deltas) + streamer.finish()
    parsed = [orjson.loads(e.data) for e in events]
    checker = GrammarChecker()
    assert [v for e in parsed for v in checker.feed(e)] + checker.finish() == []
    return parsed, response


def responses_gateway(profile: str = "openai", **overrides: Any) -> GatewayHarness:
    backend = ScriptedResponsesBackend(personality="openai")
    return GatewayHarness(
        backend=backend, upstream_api="responses", backend_profile=profile, **overrides
    )


def sdk(gw: GatewayHarness) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0)


async def stream_events(client: AsyncOpenAI, **request: Any) -> tuple[list[dict[str, Any]], Any]:
    """The events of one streamed turn through the SDK's stream helper, and its final
    Response; every event that names an item names one added before it, at its index."""
    async with client.responses.stream(model="m", input="hi", **request) as stream:
        events = [event.to_dict(warnings=False) async for event in stream]
        final = await stream.get_final_response()
    added: dict[str, int] = {}
    for event in events:
        if event["type"] == "response.output_item.added":
            added[event["item"]["id"]] = event["output_index"]
        elif "item_id" in event:
            assert added.get(event["item_id"]) == event["output_index"], event
    return events, final


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


# -- reasoning: summary parts and raw reasoning apart ---------------------------------------


def test_the_decoder_keeps_each_summary_part_and_the_raw_reasoning_apart() -> None:
    deltas = decoded(ResponsesDecoder(), recording("responses_reasoning_parts.sse"))
    reasoning = [d for d in deltas if isinstance(d, ReasoningDelta | ReasoningPart)]
    assert reasoning == [
        ReasoningPart(0), ReasoningDelta("First "), ReasoningDelta("part."),
        ReasoningPart(1), ReasoningDelta("**Check** "), ReasoningDelta("the second."),
        ReasoningPart(None),
        ReasoningDelta("The user wants a greeting. "), ReasoningDelta("Say hi."),
    ]  # fmt: skip


def test_a_whole_reasoning_item_keeps_its_parts() -> None:
    """Sent whole (no deltas, `output_item.done` only): the same parts."""
    item = {"type": "reasoning", "id": "rs_1", "content": [{"type": "reasoning_text", "text": RAW}],
            "summary": [{"type": "summary_text", "text": t} for t in SUMMARY]}  # fmt: skip
    data = b"data: " + orjson.dumps({"type": "response.output_item.done", "output_index": 0,
                                     "item": item}) + b"\n\n"  # fmt: skip
    deltas = decoded(ResponsesDecoder(), data)
    _, response = streamed(deltas)
    (out,) = response["output"]
    assert out["summary"] == [{"type": "summary_text", "text": t} for t in SUMMARY]
    assert out["content"] == [{"type": "reasoning_text", "text": RAW}]


async def test_summary_parts_reach_the_client_one_per_index() -> None:
    async with responses_gateway() as gw, sdk(gw) as client:
        gw.backend.script([recording("responses_reasoning_parts.sse")])
        events, final = await stream_events(client, reasoning={"summary": "auto"})
        gw.backend.script([recording("responses_reasoning_parts.sse")])
        whole = await client.responses.create(model="m", input="hi", reasoning={"summary": "auto"})
    reasoning = final.output[0].to_dict()
    assert [s["text"] for s in reasoning["summary"]] == SUMMARY
    assert [c["text"] for c in reasoning["content"]] == [RAW]  # raw reasoning: content only
    assert whole.output[0].to_dict()["summary"] == reasoning["summary"]
    added = of_type(events, "response.reasoning_summary_part.added")
    assert [e["summary_index"] for e in added] == [0, 1]
    done = of_type(events, "response.reasoning_summary_text.done")
    assert [(e["summary_index"], e["text"]) for e in done] == [(0, SUMMARY[0]), (1, SUMMARY[1])]
    deltas = of_type(events, "response.reasoning_summary_text.delta")
    assert "".join(e["delta"] for e in deltas) == "".join(SUMMARY)  # no raw text among them
    raw = of_type(events, "response.reasoning_text.delta")
    assert "".join(e["delta"] for e in raw) == RAW


async def test_chat_reasoning_is_the_summary_asked_for_or_the_raw_content_never_both(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    """A Chat backend's `reasoning_content` is the one text there is: the summary when the
    client asked for one (Codex and the AI SDK show summaries only), else raw reasoning,
    `content` (as vLLM's Responses serving has it); never both (a client reading both
    showed it twice)."""
    script = [*reasoning_chunks(["Let me ", "think."]), *text_chunks(["Hi"]), DONE]
    gw.backend.script(script)
    events, final = await stream_events(client, reasoning={"summary": "auto"})
    reasoning = final.output[0].to_dict()
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert reasoning.get("content") in (None, [])
    assert not any("reasoning_text" in e["type"] for e in events)
    gw.backend.script(script)
    events, final = await stream_events(client, reasoning={"effort": "low"})
    reasoning = final.output[0].to_dict()
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert not any("summary" in e["type"] for e in events)


async def test_replay_keeps_summary_and_content_apart() -> None:
    """A turn's reasoning replayed: a Responses backend that reads reasoning gets the summary
    parts and the raw content as they were; a Chat backend only the raw reasoning."""
    async with responses_gateway("vllm", store_ttl=60.0) as gw, sdk(gw) as client:
        gw.backend.script(
            [recording("responses_reasoning_parts.sse")], [*text_chunks(["ok"]), DONE]
        )
        first = await client.responses.create(model="m", input="hi", reasoning={"summary": "auto"})
        await client.responses.create(model="m", input="more", previous_response_id=first.id)
        replayed = [i for i in gw.backend.requests[1]["input"] if i.get("type") == "reasoning"]
    assert [(i["summary"], i["content"]) for i in replayed] == [
        ([{"type": "summary_text", "text": t} for t in SUMMARY],
         [{"type": "reasoning_text", "text": RAW}])
    ]  # fmt: skip
    async with GatewayHarness(store_ttl=60.0) as gw, sdk(gw) as client:
        summary = {"type": "summary_text", "text": "A summary."}
        content = {"type": "reasoning_text", "text": RAW}
        item = {"type": "reasoning", "id": "rs_1", "summary": [summary], "content": [content]}
        call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
        output = {"type": "function_call_output", "call_id": "c1", "output": "done"}
        gw.backend.script([*text_chunks(["ok"]), DONE])
        await client.responses.create(model="m", input=[item, call, output])  # type: ignore[list-item]
        assistant = gw.backend.requests[0]["messages"][0]
    assert assistant["reasoning_content"] == RAW  # the raw reasoning only, once


# -- annotations ------------------------------------------------------------------------------


def test_chat_annotations_become_the_responses_shape() -> None:
    deltas = decoded(ChatDecoder(), recording("chat_url_citation.sse"))
    assert [d.annotation for d in deltas if isinstance(d, Annotation)] == [
        {**CITATIONS[0], "content": "Streamer is..."},  # fields of its own are kept
        CITATIONS[1],
    ]


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_citations_land_in_the_part_in_order(kind: str) -> None:
    harness = GatewayHarness() if kind == "chat" else responses_gateway()
    name = "chat_url_citation.sse" if kind == "chat" else "responses_web_search.sse"
    async with harness as gw, sdk(gw) as client:
        gw.backend.script([recording(name)])
        events, final = await stream_events(client)
        gw.backend.script([recording(name)])
        whole = await client.responses.create(model="m", input="hi")
    message = final.output[-1].to_dict()
    (part,) = message["content"]
    assert part["text"] == CITED
    urls = [a["url"] for a in part["annotations"]]
    assert urls == [c["url"] for c in CITATIONS]
    added = of_type(events, "response.output_text.annotation.added")
    assert [(e["annotation_index"], e["annotation"]["url"]) for e in added] == list(enumerate(urls))
    assert {(e["item_id"], e["content_index"]) for e in added} == {(message["id"], 0)}
    assert [a["url"] for a in whole.output[-1].to_dict()["content"][0]["annotations"]] == urls


def test_annotation_indexes_follow_the_gateways_parts() -> None:
    """A second message part (after a refusal) numbers its annotations from 0 again."""
    from streamer.core.deltas import RefusalDelta

    events, response = streamed(
        [TextDelta("a"), Annotation(CITATIONS[0]), RefusalDelta("no"), Annotation(CITATIONS[1])]
    )
    added = of_type(events, "response.output_text.annotation.added")
    assert [(e["content_index"], e["annotation_index"]) for e in added] == [(0, 0), (2, 0)]
    content = response["output"][0]["content"]
    assert [p["type"] for p in content] == ["output_text", "refusal", "output_text"]
    assert content[0]["annotations"] == [CITATIONS[0]] and content[2]["annotations"] == [
        CITATIONS[1]
    ]


# -- pass-through events name the gateway's item --------------------------------------------


def test_a_hosted_calls_events_follow_its_added_under_the_gateways_id() -> None:
    deltas = decoded(ResponsesDecoder(), recording("responses_web_search.sse"))
    assert [type(d) for d in deltas[:5]] == [
        ItemAdded,
        ForeignEvent,
        ForeignEvent,
        ForeignEvent,
        WholeItem,
    ]
    events, _ = streamed(deltas)
    (added,) = [e for e in events if e["type"] == "response.output_item.added"][:1]
    assert added["item"]["id"] != "ws_b1" and added["item"]["id"].startswith("ws_")
    progress = [e for e in events if e["type"].startswith("response.web_search_call.")]
    assert [e["type"].rsplit(".", 1)[1] for e in progress] == [
        "in_progress",
        "searching",
        "completed",
    ]
    assert {(e["item_id"], e["output_index"]) for e in progress} == {(added["item"]["id"], 0)}


def test_events_before_their_item_are_held_until_it_is_added() -> None:
    """A backend that sends a hosted call's events before (or without) its added: they follow
    the gateway's `output_item.added`; with no item at all, one is opened for them."""
    progress = {"type": "response.web_search_call.searching", "item_id": "ws_9", "output_index": 0}
    item = {"type": "web_search_call", "id": "ws_9", "status": "completed",
            "action": {"type": "search", "query": "q"}}  # fmt: skip
    events, _ = streamed([ForeignEvent(progress, 0), WholeItem(item, 0), TextDelta("ok")])
    types = [e["type"] for e in events][2:6]
    assert types == ["response.output_item.added", "response.web_search_call.searching",
                     "response.output_item.done", "response.output_item.added"]  # fmt: skip
    events, response = streamed([TextDelta("ok"), ForeignEvent(progress, 7)])
    orphan = response["output"][-1]
    assert orphan["type"] == "web_search_call" and orphan["id"] != "ws_9"
    (searching,) = of_type(events, "response.web_search_call.searching")
    assert (searching["item_id"], searching["output_index"]) == (orphan["id"], 1)


async def test_the_sdk_sees_pass_through_events_of_items_it_has() -> None:
    async with responses_gateway() as gw, sdk(gw) as client:
        gw.backend.script([recording("responses_web_search.sse")])
        events, final = await stream_events(client, tools=[{"type": "web_search"}])
    search = final.output[0].to_dict()
    assert search["type"] == "web_search_call" and search["id"] != "ws_b1"
    progress = [e for e in events if e["type"].startswith("response.web_search_call.")]
    assert len(progress) == 3 and {e["item_id"] for e in progress} == {search["id"]}


# -- error.type ---------------------------------------------------------------------------------


async def test_a_backends_error_type_is_kept() -> None:
    async with responses_gateway() as gw, sdk(gw) as client:
        gw.backend.script([recording("responses_failed_typed.sse")])
        response = await client.responses.create(model="m", input="hi")
    assert response.status == "failed"
    assert response.error is not None
    assert response.error.to_dict() == {
        "code": "invalid_prompt",
        "message": "The prompt was flagged.",
        "type": "invalid_request_error",
    }


async def test_an_error_the_gateway_words_has_a_type(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script([*text_chunks(["Hal"]), DIE])
    response = await client.responses.create(model="m", input="hi")
    assert response.error is not None
    error = response.error.to_dict()
    assert error["type"] == "server_error" and error["code"] == "server_error"
    assert error["message"] == "The backend closed the stream before it finished."


def test_every_failure_carries_a_type() -> None:
    for delta in (UpstreamError("server_error", "x"), UpstreamError("context_length_exceeded", "x"),
                  UpstreamError("rate_limit_exceeded", "x"), UpstreamError("weird", "x"),
                  UpstreamError("server_error", "x", "api_error")):  # fmt: skip
        _, response = streamed([TextDelta("a"), delta])
        assert isinstance(response["error"]["type"], str), response["error"]
    assert response["error"]["type"] == "api_error"
