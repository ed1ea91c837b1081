"""`reasoning.summary` in front of a Chat backend: its reasoning is raw reasoning, so it is the
item's `reasoning_text` content (as vLLM's Responses serving has it), never a summary part,
whatever the request asked for; the summary value is echoed and checked. (A Responses
backend's own summary parts: tests/test_backend_fidelity.py.)"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, finish, reasoning_chunks, text_chunks, usage
from sdk_models import validate_event, validate_response

from streamer.tap.grammar import GrammarChecker

SCRIPT = [*reasoning_chunks(["Let me ", "think."]), *text_chunks(["Hi"]), finish("stop"),
          usage(3, 4), DONE]  # fmt: skip


def check_grammar(events: list[dict[str, Any]]) -> None:
    checker = GrammarChecker()
    violations = [v for e in events for v in checker.feed(e)] + checker.finish()
    assert violations == []


@pytest.mark.parametrize("summary", ["auto", "concise", "detailed"])
async def test_raw_reasoning_is_content_whatever_the_summary(
    summary: str, gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(SCRIPT)
    async with client.responses.stream(
        model="m",
        input="hi",
        reasoning={"summary": summary},  # type: ignore[typeddict-item]
    ) as stream:
        events = [
            event.to_dict(warnings=False) async for event in stream
        ]  # the accumulator checks them
        parsed = await stream.get_final_response()
    final = parsed.to_dict(warnings=False)
    assert parsed.output_text == "Hi"
    for event in events:
        validate_event(event)
    check_grammar(events)
    types = [e["type"] for e in events]
    assert types[:8] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert deltas == ["Let me ", "think."]
    added = events[3]
    assert (added["content_index"], added["part"]) == (0, {"type": "reasoning_text", "text": ""})
    reasoning = final["output"][0]
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert final["reasoning"]["summary"] == summary
    validate_response(final)

    gw.backend.script(SCRIPT)  # not streamed: the same item
    body = await client.responses.create(model="m", input="hi", reasoning={"summary": summary})
    assert body.output[0].to_dict()["content"] == reasoning["content"]  # type: ignore[union-attr]


async def test_no_summary_asked_means_no_summary_events(
    gw: GatewayHarness, client: AsyncOpenAI
) -> None:
    gw.backend.script(SCRIPT)
    events = [e async for e in await client.responses.create(model="m", input="hi", stream=True)]
    assert not any("summary" in e.type for e in events)
    reasoning = events[-1].response.output[0]  # type: ignore[union-attr]
    assert reasoning.summary == [] and reasoning.content[0].text == "Let me think."  # type: ignore[union-attr,index]


async def test_a_summary_replays_once(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    gw.backend.script(SCRIPT)
    first = await client.responses.create(model="m", input="hi", reasoning={"summary": "auto"})
    gw.backend.script([*text_chunks(["again"]), finish("stop"), DONE])
    await client.responses.create(
        model="m", input="more", previous_response_id=first.id, reasoning={"summary": "auto"}
    )
    assistant = gw.backend.requests[-1]["messages"][1]
    assert assistant["reasoning_content"] == "Let me think."  # not twice


async def test_an_unknown_summary_is_a_400(gw: GatewayHarness, client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(
            model="m",
            input="hi",
            reasoning={"summary": "verbose"},  # type: ignore[typeddict-item]
        )
    assert raised.value.body["param"] == "reasoning.summary"  # type: ignore[index]
    assert gw.backend.requests == []
