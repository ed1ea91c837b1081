"""The Vercel AI SDK (npm `ai` + `@ai-sdk/openai`, Responses API) against the gateway.

`tests/aisdk/driver.mjs` runs one scenario in node against the gateway on loopback (on a
scripted backend) and prints what the SDK returned; each test asserts that and what the Chat
backend received. The SDK is installed by `scripts/install-aisdk.sh` (`make aisdk`, and CI)
into `.tools/aisdk`; without node or the install the tests skip, saying which is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from harness import GatewayHarness
from scripted_backend import (
    DIE,
    DONE,
    HANG,
    Status,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "aisdk" / "driver.mjs"
AISDK_DIR = Path(os.environ.get("AISDK_DIR", REPO / ".tools" / "aisdk"))
NODE = shutil.which("node")


def _missing() -> str | None:
    if NODE is None:
        return "node is not installed (the Vercel AI SDK tests need node and npm)"
    for package in ("ai", "@ai-sdk/openai"):
        if not (AISDK_DIR / "node_modules" / package / "package.json").is_file():
            return f"{package} is not installed in {AISDK_DIR}: run `make aisdk`"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

Script = list[Any]


def _text(*parts: str) -> Script:
    return [*text_chunks(list(parts)), finish("stop"), usage(9, 4), DONE]


def _calls(*calls: tuple[str, str, str], text: str | None = None) -> Script:
    """One turn of tool calls `(id, name, arguments)`, after some text if given."""
    steps: Script = [*text_chunks([text])] if text else []
    for i, (call_id, name, args) in enumerate(calls):
        steps.extend(tool_call_chunks(i, call_id, [name], [args[:5], args[5:]]))
    return [*steps, finish("tool_calls"), usage(9, 4), DONE]


async def _run(gw: GatewayHarness, scenario: str) -> dict[str, Any]:
    """Run one driver scenario against the gateway; the SDK's result as JSON."""
    assert NODE is not None
    env = {**os.environ, "AISDK_BASE_URL": gw.url, "AISDK_SCENARIO": scenario}
    proc = await asyncio.create_subprocess_exec(
        NODE,
        "--input-type=module",
        "--eval",
        DRIVER.read_text(),
        cwd=AISDK_DIR,  # where node_modules is: bare imports resolve from here
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)  # a bound, not a sync
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    result = json.loads(out) if out else {}
    assert proc.returncode == 0, (result, err.decode(errors="replace")[-2000:])
    return result


def _roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in body["messages"]]


def _tool_outputs(body: dict[str, Any]) -> dict[str, Any]:
    return {
        m["tool_call_id"]: json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"
    }


async def test_generate_text_tool_steps(gw: GatewayHarness) -> None:
    """`generateText` with a tool over steps: two parallel calls run, then the answer."""
    gw.backend.script(
        _calls(
            ("c_paris", "weather", '{"city":"Paris"}'), ("c_rome", "weather", '{"city":"Rome"}')
        ),
        _text("Both ", "sunny."),
    )
    result = await _run(gw, "generate_tools")

    assert result["text"] == "Both sunny."
    first, second = result["steps"]
    assert first["finishReason"] == "tool-calls"
    assert first["toolCalls"] == [
        {"id": "c_paris", "name": "weather", "input": {"city": "Paris"}},
        {"id": "c_rome", "name": "weather", "input": {"city": "Rome"}},
    ]
    assert [r["output"] for r in first["toolResults"]] == [
        {"city": "Paris", "sky": "sunny"},
        {"city": "Rome", "sky": "sunny"},
    ]
    assert second["finishReason"] == "stop"
    assert result["usage"]["inputTokens"] == 18 and result["usage"]["outputTokens"] == 8

    req1, req2 = gw.backend.requests
    assert _roles(req1) == ["system", "user"]
    assert req1["messages"][0]["content"] == "Be brief."
    (decl,) = req1["tools"]
    assert decl["function"]["name"] == "weather"
    assert decl["function"]["parameters"]["required"] == ["city"]
    assert _roles(req2) == ["system", "user", "assistant", "tool", "tool"]
    calls = req2["messages"][2]["tool_calls"]
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("c_paris", {"city": "Paris"}),
        ("c_rome", {"city": "Rome"}),
    ]
    assert _tool_outputs(req2) == {
        "c_paris": {"city": "Paris", "sky": "sunny"},
        "c_rome": {"city": "Rome", "sky": "sunny"},
    }


async def test_stream_text_tool_steps(gw: GatewayHarness) -> None:
    """`streamText`: tool input streams, the call runs, the next step's text streams."""
    gw.backend.script(
        _calls(("c_oslo", "weather", '{"city":"Oslo"}')), _text("Cold ", "but ", "sunny.")
    )
    result = await _run(gw, "stream_tools")

    assert result["text"] == "Cold but sunny."
    assert result["deltas"] == ["Cold ", "but ", "sunny."]
    parts = result["parts"]
    assert parts.count("start-step") == 2 and parts.count("finish-step") == 2
    for kind in ("tool-input-start", "tool-input-delta", "tool-call", "tool-result"):
        assert kind in parts, kind
    assert parts.index("tool-result") < parts.index("text-delta")
    assert parts[-1] == "finish"
    assert [s["toolCalls"] for s in result["steps"]] == [
        [{"id": "c_oslo", "name": "weather", "input": {"city": "Oslo"}}],
        [],
    ]
    req2 = gw.backend.requests[1]
    assert _roles(req2) == ["system", "user", "assistant", "tool"]
    assert _tool_outputs(req2) == {"c_oslo": {"city": "Oslo", "sky": "sunny"}}


def _script_chat(gw: GatewayHarness) -> None:
    gw.backend.script(
        _text("Hello ", "Ada."),
        # a step with text and a tool call, then the answer
        _calls(("c_lima", "weather", '{"city":"Lima"}'), text="Let me check."),
        _text("Lima is sunny."),
        _text("You are Ada."),
    )


def _assert_chat(gw: GatewayHarness, result: dict[str, Any]) -> None:
    assert [t["text"] for t in result["turns"]] == ["Hello Ada.", "Lima is sunny.", "You are Ada."]
    tool_turn = result["turns"][1]["steps"]
    assert [s["text"] for s in tool_turn] == ["Let me check.", "Lima is sunny."]
    assert tool_turn[0]["toolResults"] == [
        {"id": "c_lima", "output": {"city": "Lima", "sky": "sunny"}}
    ]
    _, call_step, answer_step, last = gw.backend.requests
    assert _roles(call_step) == ["system", "user", "assistant", "user"]
    assert call_step["messages"][2]["content"] == "Hello Ada."
    # the step's text and its call are one assistant turn to the backend
    assert _roles(answer_step) == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert answer_step["messages"][4]["content"] == "Let me check."
    assert answer_step["messages"][4]["tool_calls"][0]["id"] == "c_lima"
    assert _roles(last) == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert [last["messages"][i].get("content") for i in (2, 4, 6, 7)] == [
        "Hello Ada.",
        "Let me check.",
        "Lima is sunny.",
        "What is my name?",
    ]


async def test_multi_turn_chat_no_store(gw: GatewayHarness) -> None:
    """A chat with `store: false`: the SDK resends every earlier item in full."""
    _script_chat(gw)
    result = await _run(gw, "chat_no_store")
    _assert_chat(gw, result)


async def test_multi_turn_chat_store(gw: GatewayHarness) -> None:
    """The SDK's default `store: true`: earlier assistant text comes back as item_reference."""
    _script_chat(gw)
    result = await _run(gw, "chat_store")
    _assert_chat(gw, result)


async def test_generate_object(gw: GatewayHarness) -> None:
    """`generateObject`: a json_schema format reaches the backend; the answer parses into it."""
    gw.backend.script(_text('{"city":', '"Rome","high":31}'))
    result = await _run(gw, "object")

    assert result == {"object": {"city": "Rome", "high": 31}, "finishReason": "stop"}
    (req,) = gw.backend.requests
    fmt = req["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "forecast"
    assert fmt["json_schema"]["description"] == "A weather forecast."
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["required"] == ["city", "high"]


async def test_namespace_tools(gw: GatewayHarness) -> None:
    """A tool in a namespace (provider options): flat to the backend, routed back by namespace."""
    gw.backend.script(_calls(("c_7", "crm__lookup", '{"id":7}')), _text("Customer 7 is Ada."))
    result = await _run(gw, "namespace_tools")

    assert result["text"] == "Customer 7 is Ada."
    (call,) = result["calls"]
    assert call["name"] == "lookup"
    assert call["metadata"]["namespace"] == "crm"
    assert result["steps"][0]["toolResults"] == [{"id": "c_7", "output": "customer 7: Ada"}]
    first, second = gw.backend.requests
    decls = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert sorted(decls) == ["crm__lookup", "weather"]
    assert decls["crm__lookup"]["description"] == "The CRM.\n\nA customer's record."
    # the call comes back in history with its namespace and is flattened the same way
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "crm__lookup"
    assert second["messages"][2] == {
        "role": "tool",
        "tool_call_id": "c_7",
        "content": "customer 7: Ada",
    }


async def test_failures(gw: GatewayHarness) -> None:
    """A backend 400 is the SDK's APICallError with its message; a cut stream an error part."""
    refusal = {"error": {"message": "model does not exist", "type": "invalid_request_error"}}
    gw.backend.script([Status(400, refusal)], [*text_chunks(["Hal"]), DIE])
    result = await _run(gw, "failures")

    assert result["refused"] == {
        "name": "AI_APICallError",
        "status": 400,
        "message": "model does not exist",
    }
    parts = result["parts"]
    assert parts[: parts.index("text-delta") + 1] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
    ]
    errors = [p["error"] for p in parts if isinstance(p, dict)]
    assert errors == ["The backend closed the stream before it finished."]
    assert parts[-1] == "finish"


async def test_previous_response_id(gw: GatewayHarness) -> None:
    """`previousResponseId`: the SDK sends the new message only; the backend gets the history."""
    gw.backend.script(_text("Hello Ada."), _text("You are Ada."))
    result = await _run(gw, "previous_response")

    assert result["texts"] == ["Hello Ada.", "You are Ada."]
    assert result["id"].startswith("resp_")
    _, second = gw.backend.requests
    assert [(m["role"], m["content"]) for m in second["messages"]] == [
        ("user", "I am Ada."),
        ("assistant", "Hello Ada."),
        ("user", "What is my name?"),
    ]


async def test_image_and_pdf(gw: GatewayHarness) -> None:
    """File parts: an image becomes an image_url data URL, a PDF a file with its name."""
    result = await _run(gw, "media")

    assert result == {"text": "Hello!"}
    (req,) = gw.backend.requests
    text, image, pdf = req["messages"][0]["content"]
    assert text == {"type": "text", "text": "Describe both."}
    assert image["type"] == "image_url"
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert pdf == {
        "type": "file",
        "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "a.pdf"},
    }


async def test_reasoning_summary(gw: GatewayHarness) -> None:
    """`reasoningSummary: "auto"` in front of a Chat backend: its reasoning is the summary the
    SDK asked for, shown once (it was doubled when it was both the summary and the content).
    (A backend's own summary parts: test_reasoning_summary_parts_...)"""
    gw.backend.script(
        [*reasoning_chunks(["Deep ", "thought."]), *text_chunks(["Done."]), finish(), DONE]
    )
    result = await _run(gw, "reasoning")

    assert result["text"] == "Done."
    assert gw.backend.requests[0]["reasoning_effort"] == "low"
    assert result["deltas"] == ["Deep ", "thought."]
    assert result["reasoning"] in ("Deep thought.", ["Deep thought."])


async def test_abort_mid_answer(gw: GatewayHarness) -> None:
    """`abortSignal` mid-stream: the SDK ends the stream aborted; the backend request stops."""
    gw.backend.script([*text_chunks(["Hel"]), HANG])
    result = await _run(gw, "abort")

    assert result["parts"][-1] == "abort"
    assert "text-delta" in result["parts"]
    await gw.backend.records[-1].wait_disconnect()


async def test_shell_tool(gw: GatewayHarness) -> None:
    """`openai.tools.shell`: a function `shell` to the backend, back as a shell_call the SDK
    runs; with `store: true` the next step names the call by item_reference, resolved
    through the store, and its output replays as a tool message."""
    gw.backend.script(
        _calls(("c_sh", "shell", '{"commands": ["ls -1"], "timeout_ms": 800}')),
        _text("There is notes.txt."),
    )
    result = await _run(gw, "shell")

    assert result["text"] == "There is notes.txt."
    assert result["actions"] == [{"commands": ["ls -1"], "timeoutMs": 800}]
    first, second = result["steps"]
    assert first["toolCalls"][0]["name"] == "shell" and first["toolCalls"][0]["id"] == "c_sh"
    assert first["toolResults"][0]["output"]["output"][0]["stdout"] == "notes.txt\n"
    assert second["finishReason"] == "stop"
    req1, req2 = gw.backend.requests
    assert [t["function"]["name"] for t in req1["tools"]] == ["shell"]
    assert _roles(req2) == ["system", "user", "assistant", "tool"]
    (replayed,) = req2["messages"][2]["tool_calls"]
    assert replayed["function"]["name"] == "shell"
    assert json.loads(replayed["function"]["arguments"]) == {
        "commands": ["ls -1"],
        "timeout_ms": 800,
    }
    assert req2["messages"][3] == {
        "role": "tool",
        "tool_call_id": "c_sh",
        "content": "notes.txt\n[exit code 0]",
    }


async def test_apply_patch_tool(gw: GatewayHarness) -> None:
    """`openai.tools.applyPatch`, streamed: back as an apply_patch_call whose operation the SDK
    streams as tool input and applies; its output replays as a tool message."""
    operation = {"type": "create_file", "path": "hello.txt", "diff": "+hello\n"}
    gw.backend.script(_calls(("c_ap", "apply_patch", json.dumps(operation))), _text("Created."))
    result = await _run(gw, "apply_patch")

    assert result["text"] == "Created."
    assert result["operations"] == [operation]
    assert json.loads(result["inputs"]["c_ap"]) == {"callId": "c_ap", "operation": operation}
    assert result["steps"][0]["toolCalls"][0]["name"] == "apply_patch"
    req1, req2 = gw.backend.requests
    assert [t["function"]["name"] for t in req1["tools"]] == ["apply_patch"]
    assert _roles(req2) == ["user", "assistant", "tool"]
    (replayed,) = req2["messages"][1]["tool_calls"]
    assert json.loads(replayed["function"]["arguments"]) == operation
    assert req2["messages"][2]["content"] == "Created hello.txt"


# -- issue 30: what a backend sends reaches the SDK whole ---------------------------------

RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "backends"
SUMMARY = ["First part.", "**Check** the second."]


def _responses_gateway() -> GatewayHarness:
    """The gateway in front of a `/v1/responses` backend that answers like OpenAI."""
    from scripted_responses_backend import ScriptedResponsesBackend

    backend = ScriptedResponsesBackend(personality="openai")
    return GatewayHarness(backend=backend, upstream_api="responses", backend_profile="openai")


async def test_reasoning_summary_parts_are_not_doubled() -> None:
    """A backend's two summary parts and its raw reasoning: `reasoningText` is the summary,
    each part once and its own, the raw reasoning not in it (it was both, run together)."""
    recording = (RECORDINGS / "responses_reasoning_parts.sse").read_bytes()
    async with _responses_gateway() as gw:
        gw.backend.script([recording], [recording])
        result = await _run(gw, "reasoning_parts")
    assert result["parts"] == SUMMARY
    for text in (result["streamed"], result["whole"]):
        assert all(text.count(part) == 1 for part in SUMMARY), text
        assert "greeting" not in text, text  # the raw reasoning is content, not summary


async def test_web_search_citations_are_sources() -> None:
    """A hosted web search's `url_citation`s are the SDK's sources, streamed and not."""
    recording = (RECORDINGS / "responses_web_search.sse").read_bytes()
    async with _responses_gateway() as gw:
        gw.backend.script([recording], [recording])
        result = await _run(gw, "sources")
    urls = ["https://example.com/docs", "https://example.com/blog"]
    assert result["streamed"] == urls and result["whole"] == urls
    assert result["text"].startswith("Streamer is a gateway")
    assert gw.backend.requests[0]["tools"] == [{"type": "web_search"}]


async def test_a_failed_turn_says_why(gw: GatewayHarness) -> None:
    """Not streamed, a turn that fails mid-way is the SDK's error with the gateway's message
    (the SDK's schema needs `error.type`; without it: "Invalid JSON response")."""
    gw.backend.script([*text_chunks(["Hal"]), DIE])
    result = await _run(gw, "failed_turn")
    assert result["error"] == {
        "name": "AI_APICallError",
        "message": "The backend closed the stream before it finished.",
    }
