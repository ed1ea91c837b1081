"""The real Codex CLI against the gateway and its embedded scripted model (no --upstream).

One `codex exec` turn asks for the probe MCP server's `echo_marker` tool. Codex sends it as a
member of the `mcp__probe` namespace; the gateway flattens it for the scripted model, restores
`name` + `namespace` on the call, Codex runs the MCP tool and replays its output, and the
scripted model quotes that output back. A relay between Codex and the gateway records which
transport carried the turn.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from codex_harness import (
    MARKER,
    CodexRun,
    SniffingProxy,
    codex_binary,
    http_get_json,
    result_text,
    run_codex,
    start_gateway,
)

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]

PROMPT = "Call the echo_marker tool with text hello"
EXPECTED_RESULT = f"{MARKER}:hello"


def assert_tool_round_trip(run: CodexRun) -> None:
    """The namespaced MCP call completed, really ran, and its output reached the model."""
    assert run.returncode == 0, run.describe()
    # the gateway described the model (GET /v1/models): no fallback metadata
    assert run.metadata_warnings("scripted") == [], run.describe()
    call = run.completed_mcp_call("echo_marker")
    assert call is not None, run.describe()
    assert call["server"] == "probe"
    assert call["arguments"] == {"text": "hello"}
    assert result_text(call) == EXPECTED_RESULT
    assert run.probe_calls == [{"tool": "echo_marker", "arguments": {"text": "hello"}}]
    # The second request carried the function_call_output; the scripted model quotes it.
    messages = [i.get("text", "") for i in run.items("agent_message")]
    assert any(EXPECTED_RESULT in m for m in messages), run.describe()
    assert any(e.get("type") == "turn.completed" for e in run.events), run.describe()


async def test_codex_over_http(tmp_path: Path) -> None:
    async with (
        start_gateway(tmp_path / "gateway.log") as gateway,
        SniffingProxy(gateway.port) as proxy,
    ):
        run = await run_codex(f"http://127.0.0.1:{proxy.port}/v1", PROMPT, tmp_path)
    assert_tool_round_trip(run)
    traffic = proxy.traffic
    # The call turn and the follow-up carrying its output, both as POSTs.
    assert traffic.count("POST /v1/responses") >= 2, traffic
    assert traffic.switched == 0, traffic


async def test_codex_over_websocket(tmp_path: Path) -> None:
    async with (
        start_gateway(tmp_path / "gateway.log") as gateway,
        SniffingProxy(gateway.port) as proxy,
    ):
        run = await run_codex(
            f"http://127.0.0.1:{proxy.port}/v1", PROMPT, tmp_path, supports_websockets=True
        )
        # From the gateway itself: every turn (warm-up, the call, the turn carrying its
        # output) was served on a socket and none over HTTP.
        stats = (await http_get_json(f"http://127.0.0.1:{gateway.port}/healthz"))["stats"]
    assert_tool_round_trip(run)
    assert run.fallback_messages() == [], run.describe()
    assert stats["ws_connections"] >= 1 and stats["http_turns"] == 0, stats
    assert stats["ws_turns"] >= 3, stats  # warm-up, the call turn, the turn with its output
    traffic = proxy.traffic
    # Codex falls back to HTTP *silently* when the upgrade is refused with 426/404/405, so
    # the absence of a fallback message is not enough: the upgrade must have been accepted
    # and no turn may have been POSTed.
    assert traffic.count("GET /v1/responses (upgrade)") >= 1, traffic
    assert traffic.switched >= 1, traffic
    assert traffic.count("POST /v1/responses") == 0, traffic
