"""The real Codex CLI against the gateway in front of a Responses backend that flattens
names (`--upstream-api responses`, a vLLM-like scripted backend: function tools only, a 400
to namespace and custom tools, calls answered with the flat `mcp__probe__echo_marker`).

Codex sends the probe MCP server's tools as the `mcp__probe` namespace; the gateway sends
them to the backend flattened, restores `namespace` + `name` on the call, so Codex runs the
MCP tool (no "unsupported call") and the backend gets its output back in the whole history
(`store: false`: the gateway keeps the state), over HTTP and over the WebSocket mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from codex_harness import SniffingProxy, codex_binary, run_codex, start_gateway
from scripted_backend import DONE, finish, text_chunks, tool_call_chunks, usage
from scripted_responses_backend import ScriptedResponsesBackend
from test_codex_cli import PROMPT, assert_tool_round_trip

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]
END = [finish("stop"), usage(20, 5), DONE]


def _output_text(item: dict[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    return str(output)


def answer(body: Any) -> list[Any]:
    """The model: calls echo_marker (by the flat name it was given), then quotes its output."""
    items = body.get("input") or []
    if items and items[-1].get("type") == "function_call_output":
        return [*text_chunks([f"The tool said: {_output_text(items[-1])}"]), *END]
    flat = [t["name"] for t in body.get("tools") or () if t["name"].endswith("echo_marker")]
    if not flat:
        return [*text_chunks(["ok"]), *END]
    call = tool_call_chunks(0, "call_echo", [flat[0]], ['{"text":', '"hello"}'])
    return [*call, finish("tool_calls"), usage(20, 5), DONE]


def _checked(backend: ScriptedResponsesBackend) -> None:
    """What the backend saw: only function tools, flat names, never asked to store."""
    sent = [body for body in backend.requests if body.get("tools")]
    assert sent, backend.requests
    for body in sent:
        assert body["store"] is False and body["stream"] is True
        assert {t["type"] for t in body["tools"]} == {"function"}
        assert "mcp__probe__echo_marker" in {t["name"] for t in body["tools"]}
    replay = [
        b
        for b in backend.requests
        if any(i.get("type") == "function_call_output" for i in b["input"])
    ]
    assert replay, "the MCP output never reached the backend"
    calls = [i for i in replay[-1]["input"] if i.get("type") == "function_call"]
    assert [(c["name"], c.get("namespace")) for c in calls] == [("mcp__probe__echo_marker", None)]


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_codex_mcp_call_over_a_flattening_responses_backend(
    tmp_path: Path, websocket: bool
) -> None:
    backend = ScriptedResponsesBackend(personality="vllm", responder=answer, models=["scripted"])
    async with backend:
        flags = [
            "--upstream",
            backend.base_url,
            "--upstream-api",
            "responses",
            "--backend-profile",
            "vllm",
        ]
        async with (
            start_gateway(tmp_path / "gateway.log", *flags) as gateway,
            SniffingProxy(gateway.port) as proxy,
        ):
            run = await run_codex(
                f"http://127.0.0.1:{proxy.port}/v1", PROMPT, tmp_path, supports_websockets=websocket
            )
        assert_tool_round_trip(run)
        _checked(backend)
    traffic = proxy.traffic
    if websocket:
        assert traffic.switched >= 1 and traffic.count("POST /v1/responses") == 0, traffic
    else:
        assert traffic.count("POST /v1/responses") >= 2 and traffic.switched == 0, traffic
