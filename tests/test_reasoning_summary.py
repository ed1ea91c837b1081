"""`reasoning.summary` in front of a Chat backend: its reasoning is the one text there is, so it
is the summary when the client asked for one (Codex and the AI SDK show summaries only), else
the item's raw `reasoning_text` content (as vLLM's Responses serving has it); never both, so a
client that reads both shows it once. The summary value is echoed and checked. (A Responses
backend's own summary parts and raw text, kept apart: tests/test_backend_fidelity.py.)"""

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
async def test_reasoning_is_the_summary_asked_for_and_only_that(
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
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"]
    assert deltas == ["Let me ", "think."]
    assert not any("reasoning_text" in e["type"] for e in events)  # never both
    added = events[3]
    assert (added["summary_index"], added["part"]) == (0, {"type": "summary_text", "text": ""})
    reasoning = final["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert reasoning.get("content") in (None, [])
    assert final["reasoning"]["summary"] == summary
    validate_response(final)

    gw.backend.script(SCRIPT)  # not streamed: the same item
    body = await client.responses.create(model="m", input="hi", reasoning={"summary": summary})
    assert body.output[0].to_dict()["summary"] == reasoning["summary"]  # type: ignore[union-attr]


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
