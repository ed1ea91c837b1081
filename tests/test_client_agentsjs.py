"""The OpenAI Agents SDK for JavaScript (npm `@openai/agents`, Responses API) against the gateway.

`tests/agentsjs/driver.mjs` runs one scenario in node against the gateway on loopback (on a
scripted backend: Chat, or `/v1/responses` playing a recording of tests/fixtures/backends)
and prints what the SDK returned. The SDK is installed by `scripts/install-agentsjs.sh`
(`make agentsjs`, and CI) into `.tools/agentsjs`; without node or the install the tests
skip, saying which is missing.
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
from scripted_backend import DIE, DONE, finish, text_chunks, tool_call_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "agentsjs" / "driver.mjs"
AGENTSJS_DIR = Path(os.environ.get("AGENTSJS_DIR", REPO / ".tools" / "agentsjs"))
RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "backends"
NODE = shutil.which("node")


def _missing() -> str | None:
    if NODE is None:
        return "node is not installed (the Agents SDK for JavaScript tests need node and npm)"
    if not (AGENTSJS_DIR / "node_modules" / "@openai" / "agents" / "package.json").is_file():
        return f"@openai/agents is not installed in {AGENTSJS_DIR}: run `make agentsjs`"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


async def _run(gw: GatewayHarness, scenario: str) -> dict[str, Any]:
    """Run one driver scenario against the gateway; the SDK's result as JSON."""
    assert NODE is not None
    env = {**os.environ, "AGENTS_BASE_URL": gw.url, "AGENTS_SCENARIO": scenario}
    proc = await asyncio.create_subprocess_exec(
        NODE,
        "--input-type=module",
        "--eval",
        DRIVER.read_text(),
        cwd=AGENTSJS_DIR,  # where node_modules is: bare imports resolve from here
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


def _responses_gateway() -> GatewayHarness:
    backend = ScriptedResponsesBackend(personality="openai")
    return GatewayHarness(backend=backend, upstream_api="responses", backend_profile="openai")


def _call(call_id: str, arguments: str) -> list[Any]:
    return [
        *tool_call_chunks(0, call_id, ["weather"], [arguments[:5], arguments[5:]]),
        finish("tool_calls"),
        usage(9, 4),
        DONE,
    ]


def _types(result: dict[str, Any]) -> list[str]:
    return [item["type"] for item in result["items"]]


async def test_tool_loop(gw: GatewayHarness) -> None:
    """`run(agent)`: the call comes back, the SDK runs the tool, its output goes back."""
    gw.backend.script(_call("c_paris", '{"city":"Paris"}'), [*text_chunks(["Sunny."]), DONE])
    result = await _run(gw, "tool_loop")

    assert result["output"] == "Sunny."
    assert _types(result) == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    call = result["items"][0]["raw"]
    assert (call["name"], call["callId"], json.loads(call["arguments"])) == (
        "weather",
        "c_paris",
        {"city": "Paris"},
    )
    second = gw.backend.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "c_paris", "content": "Paris: sunny"}


async def test_streamed_run(gw: GatewayHarness) -> None:
    """`run(agent, …, {stream: true})`: the answer's text deltas as the backend sent them."""
    gw.backend.script(
        _call("c_oslo", '{"city":"Oslo"}'), [*text_chunks(["Cold ", "and sunny."]), DONE]
    )
    result = await _run(gw, "streamed")

    assert result["output"] == "Cold and sunny."
    assert result["deltas"] == ["Cold ", "and sunny."]
    assert _types(result)[:2] == ["tool_call_item", "tool_call_output_item"]


async def test_hosted_web_search_events_name_the_gateways_item() -> None:
    """A hosted web search on a /v1/responses backend: the SDK gets the search item and its
    progress events under one id (the gateway's), and the answer's citations."""
    async with _responses_gateway() as gw:
        gw.backend.script([(RECORDINGS / "responses_web_search.sse").read_bytes()])
        result = await _run(gw, "web_search")

    assert result["output"].startswith("Streamer is a gateway")
    events = result["events"]
    (added,) = [e for e in events if e["type"] == "response.output_item.added"][:1]
    search_id = added["item"]["id"]
    assert added["item"]["type"] == "web_search_call" and search_id != "ws_b1"
    progress = [e for e in events if e["type"].startswith("response.web_search_call.")]
    assert [e["item_id"] for e in progress] == [search_id] * 3
    assert events.index(added) < events.index(progress[0])
    message = [i["raw"] for i in result["items"] if i["type"] == "message_output_item"][-1]
    urls = [a["url"] for a in message["content"][0]["providerData"]["annotations"]]
    assert urls == ["https://example.com/docs", "https://example.com/blog"]


async def test_reasoning_keeps_summary_and_raw_reasoning_apart() -> None:
    async with _responses_gateway() as gw:
        gw.backend.script([(RECORDINGS / "responses_reasoning_parts.sse").read_bytes()])
        result = await _run(gw, "reasoning")

    assert result["output"] == "Hi!"
    (reasoning,) = [i["raw"] for i in result["items"] if i["type"] == "reasoning_item"]
    # the SDK's reasoning item: the summary parts as its content, the raw reasoning kept aside
    assert [p["text"] for p in reasoning["content"]] == ["First part.", "**Check** the second."]
    raw = reasoning["providerData"]["content"]
    assert [p["text"] for p in raw] == ["The user wants a greeting. Say hi."]


async def test_a_failed_turn_is_an_error(gw: GatewayHarness) -> None:
    """A turn that fails mid-way: the SDK throws (it words the message itself)."""
    gw.backend.script([*text_chunks(["Hal"]), DIE])
    result = await _run(gw, "failure")
    assert result["error"] is not None
    assert "response.failed" in result["error"]["message"]
