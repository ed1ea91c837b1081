"""Images and files in tool outputs (issue 15): Codex's `view_image` answers with a
`function_call_output` whose `output` holds an `input_image` data URL. A Chat `tool` message
carries text only, so the image goes to the backend in a user message right after the tool
messages, and the tool message says where it went. Files go as Chat `file` parts where the
backend takes them (`--file-parts`), else as a note. Driven with the official SDK; the
assertions are on what the scripted backend received."""

from __future__ import annotations

from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI, BadRequestError

from streamer.core.lowering import TOOL_MEDIA_MARK

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
PDF = "data:application/pdf;base64,JVBERi0xLjQK"
VIEW = {
    "type": "function",
    "name": "view_image",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}


def call(call_id: str, name: str = "view_image") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str, *parts: dict[str, Any], kind: str = "function_call_output") -> Any:
    return {"type": kind, "call_id": call_id, "output": list(parts)}


def image(url: str = PNG, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **extra}


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def pdf(name: str = "report.pdf") -> dict[str, Any]:
    return {"type": "input_file", "file_data": PDF, "filename": name}


async def sent_messages(gw: GatewayHarness, items: list[Any], **fields: Any) -> Any:
    """The `messages` the backend received for one SDK request with `items` as input."""
    async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
        response = await client.responses.create(
            model="m", input=items, tools=fields.pop("tools", [VIEW]), **fields
        )
    assert response.status == "completed"
    return gw.backend.requests[-1]["messages"]


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


@pytest.fixture
async def gw() -> Any:
    async with GatewayHarness() as harness:
        yield harness


async def test_view_image_output_reaches_the_backend_as_a_user_image(gw: GatewayHarness) -> None:
    items = [
        {"role": "user", "content": "Look at cat.png"},
        call("c1"),
        output("c1", image(detail="original")),
    ]
    messages = await sent_messages(gw, items)
    assert roles(messages) == ["user", "assistant", "tool", "user"]
    tool, after = messages[2], messages[3]
    assert tool == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "[image: sent in the next message]",
    }
    assert after["content"] == [
        {"type": "text", "text": f"{TOOL_MEDIA_MARK} c1]"},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
    ]
    assert "[image omitted]" not in str(messages)


async def test_parallel_outputs_keep_the_tool_messages_together(gw: GatewayHarness) -> None:
    """Chat wants every tool message right after its assistant message: one user message
    after the run of them holds the images of all, each headed by its call id."""
    items = [
        {"role": "user", "content": "Compare"},
        call("a"),
        call("b"),
        output("a", text("first"), image("https://x/a.png", detail="low")),
        output("b", image()),
        {"role": "user", "content": "Which is larger?"},
    ]
    messages = await sent_messages(gw, items)
    assert roles(messages) == ["user", "assistant", "tool", "tool", "user", "user"]
    assert messages[2]["content"] == "first\n[image: sent in the next message]"
    assert messages[4]["content"] == [
        {"type": "text", "text": f"{TOOL_MEDIA_MARK} a]"},
        {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
        {"type": "text", "text": f"{TOOL_MEDIA_MARK} b]"},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]
    assert messages[5] == {"role": "user", "content": "Which is larger?"}


async def test_custom_tool_output_images_too(gw: GatewayHarness) -> None:
    items = [
        {"role": "user", "content": "Patch it"},
        {"type": "custom_tool_call", "call_id": "p", "name": "apply_patch", "input": "x"},
        output("p", text("done"), image(), kind="custom_tool_call_output"),
    ]
    messages = await sent_messages(gw, items, tools=[PATCH])
    assert roles(messages) == ["user", "assistant", "tool", "user"]
    assert messages[2]["content"] == "done\n[image: sent in the next message]"
    assert messages[3]["content"][1] == {"type": "image_url", "image_url": {"url": PNG}}


async def test_images_come_before_a_later_developer_message(gw: GatewayHarness) -> None:
    """A developer message after the outputs joins the leading system message (merge) and
    the images still follow the tool messages directly."""
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Look"},
        call("c"),
        output("c", image()),
        {"role": "developer", "content": "Sandbox changed."},
    ]
    messages = await sent_messages(gw, items)
    assert roles(messages) == ["system", "user", "assistant", "tool", "user"]
    assert messages[0]["content"] == "Be brief.\n\nSandbox changed."


async def refused(gw: GatewayHarness, items: list[Any]) -> Any:
    """The 400 for one SDK request with `items` as input; the backend saw nothing."""
    seen = len(gw.backend.requests)
    async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client:
        with pytest.raises(BadRequestError) as caught:
            await client.responses.create(model="m", input=items, tools=[VIEW])
    assert len(gw.backend.requests) == seen
    return caught.value.body


async def test_a_file_for_a_backend_without_file_input_is_a_400() -> None:
    async with GatewayHarness(backend_profile="llamacpp") as gw:
        await _refused_files(gw)


async def _refused_files(gw: GatewayHarness) -> None:
    items = [{"role": "user", "content": "Read"}, call("c"), output("c", text("ok"), pdf())]
    error = await refused(gw, items)
    assert error["param"] == "input[2].output[1]" and "--file-parts" in error["message"]
    user_file = [{"role": "user", "content": [{"type": "input_text", "text": "Read"}, pdf()]}]
    assert (await refused(gw, user_file))["param"] == "input[0].content[1]"


@pytest.mark.parametrize("how", [{}, {"file_parts": True}, {"backend_profile": "openai"}])
async def test_files_go_as_file_parts_where_the_backend_takes_them(how: dict[str, Any]) -> None:
    async with GatewayHarness(**how) as gw:
        items = [{"role": "user", "content": "Read"}, call("c"), output("c", pdf(), image())]
        messages = await sent_messages(gw, items)
    assert roles(messages) == ["user", "assistant", "tool", "user"]
    assert messages[2]["content"] == (
        "[file: sent in the next message]\n[image: sent in the next message]"
    )
    assert messages[3]["content"][1:] == [
        {"type": "file", "file": {"file_data": PDF, "filename": "report.pdf"}},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]


async def test_an_image_by_file_id_or_a_file_by_url_is_a_400(gw: GatewayHarness) -> None:
    by_id = {"type": "input_image", "file_id": "file-1"}
    items = [{"role": "user", "content": "Look"}, call("c"), output("c", by_id)]
    error = await refused(gw, items)
    assert error["param"] == "input[2].output[0]" and "file_id" in error["message"]
    by_url = {"type": "input_file", "file_url": "https://x/report.pdf"}
    error = await refused(gw, [{"role": "user", "content": [by_url]}])
    assert error["param"] == "input[0].content[0]" and "file_url" in error["message"]
