"""The pure parts of remote MCP tools, over plain values: the servers read from a request,
the loop's decisions, the history's replay, the host rule and the hosted-tool check."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from streamer.core.echo import echo_tool
from streamer.core.errors import RequestError
from streamer.core.hosted_tools import check as hosted_check
from streamer.core.mcp_history import approvals, listed, replayed
from streamer.core.mcp_items import ListedTool, outcome
from streamer.core.mcp_loop import McpCall, McpLimits, McpTurn, budget
from streamer.core.mcp_servers import McpServer, ToolFilter, public, servers
from streamer.mcp.guard import Blocked, HostRule
from streamer.turns.recorder import ExchangeRecorder

URL = "https://mcp.example.com/secret/path"


def tool(**fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "docs", "server_url": URL, **fields}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"server_label": ""}, "tools[0].server_label"),
        ({"server_url": "ftp://x"}, "tools[0].server_url"),
        ({"server_url": "https://u:p@x/mcp"}, "tools[0].server_url"),
        ({"headers": {"X": 1}}, "tools[0].headers"),
        ({"headers": {"X": "a\nb"}}, "tools[0].headers"),
        ({"require_approval": "sometimes"}, "tools[0].require_approval"),
        ({"allowed_tools": {"tool_names": "x"}}, "tools[0].allowed_tools.tool_names"),
        ({"connector_id": "connector_gmail"}, "tools[0].connector_id"),
    ],
)
def test_a_malformed_mcp_tool_is_a_400_naming_its_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as error:
        servers([tool(**fields)])
    assert error.value.status == 400 and error.value.param == param


def test_a_duplicate_label_and_mcp_off_are_400s() -> None:
    with pytest.raises(RequestError) as duplicate:
        servers([tool(), tool()])
    assert duplicate.value.param == "tools[1].server_label"
    with pytest.raises(RequestError) as off:
        servers([tool()], enabled=False)
    assert off.value.param == "tools[0].type"


def test_headers_and_authorization_are_kept_apart_and_never_public() -> None:
    (server,) = servers([tool(headers={"X-Key": "k1"}, authorization="tok")])
    assert dict(server.headers) == {"X-Key": "k1", "Authorization": "Bearer tok"}
    shown = public(tool(headers={"X-Key": "k1"}, authorization="tok"))
    assert shown["headers"] is None and "authorization" not in shown
    assert shown["server_url"] == "https://mcp.example.com/<redacted>"
    assert "k1" not in server.key and "tok" not in server.key  # a digest
    (other,) = servers([tool(headers={"X-Key": "k2"})])
    assert other.key != server.key  # per URL and headers


def test_approval_filters() -> None:
    (server,) = servers([tool(require_approval={"never": {"tool_names": ["read"]}})])
    assert not server.needs_approval("read", False)
    assert server.needs_approval("write", False)
    (always,) = servers([tool()])  # OpenAI's default
    assert always.needs_approval("read", True)
    (read_only,) = servers([tool(require_approval={"never": {"read_only": True}})])
    assert not read_only.needs_approval("x", True) and read_only.needs_approval("x", False)


def loop(approval: Any = "never", calls: int = 32) -> McpTurn:
    server = McpServer("docs", URL, approval=approval, allowed=ToolFilter(frozenset({"read"})))
    tools = {"docs": {"read": ListedTool("read", None, {"type": "object"})}}
    return McpTurn({"docs": server}, tools, budget=calls, limits=McpLimits(max_calls=calls))


def test_the_plan_runs_asks_refuses_and_says_when_to_go_on() -> None:
    call = McpCall("docs", "read", "{}")
    plan = loop().plan([call], client_calls=False, finish="tool_calls")
    assert [s.action for s in plan.steps] == ["run"] and plan.again
    assert not loop().plan([call], client_calls=True, finish="tool_calls").again
    assert not loop().plan([call], client_calls=False, finish="length").again
    asked = loop("always").plan([call], client_calls=False, finish="tool_calls")
    assert [s.action for s in asked.steps] == ["ask"] and not asked.again
    unknown = loop().plan([McpCall("docs", "write", "{}")], False, "tool_calls")
    assert unknown.steps[0].action == "refuse" and unknown.steps[0].error["code"] == 404  # type: ignore[index]


def test_the_budget_ends_the_loop() -> None:
    turn = loop(calls=1)
    call = McpCall("docs", "read", "{}")
    first = turn.plan([call, call], False, "tool_calls")
    assert [s.action for s in first.steps] == ["run", "refuse"]
    assert turn.exhausted and turn.continued({"tool_choice": "required"})["tool_choice"] == "none"
    assert budget({"max_tool_calls": 3}, McpLimits(max_calls=2)) == 2
    assert budget({"max_tool_calls": 1}, McpLimits(max_calls=2)) == 1


def test_the_history_replays_calls_and_declines_and_remembers_lists() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "mcp_list_tools", "id": "l", "server_label": "docs",
         "tools": [{"name": "read", "input_schema": {"type": "object"}}]},
        {"type": "mcp_call", "id": "c", "server_label": "docs", "name": "read",
         "arguments": "{}", "output": "text", "error": None},
        {"type": "mcp_approval_request", "id": "r", "server_label": "docs", "name": "read",
         "arguments": "{}"},
        {"type": "mcp_approval_response", "approval_request_id": "r", "approve": False},
    ]  # fmt: skip
    assert [t.name for t in listed(items)["docs"]] == ["read"]
    shown = replayed(items)
    assert [i["type"] for i in shown] == [
        "message", "mcp_call", "mcp_call_output", "mcp_call", "mcp_call_output",
    ]  # fmt: skip
    assert shown[2]["output"] == "text" and "declined" in shown[4]["output"]
    assert [a.approve for a in approvals(items, 4)] == [False]
    with pytest.raises(RequestError) as unknown:
        approvals([{"type": "mcp_approval_response", "approval_request_id": "x", "approve": 1}], 0)
    assert unknown.value.param == "input[0].approve"


def test_a_result_becomes_output_or_error() -> None:
    assert outcome({"content": [{"type": "text", "text": "a"}]}) == ("a", None)
    assert outcome({"content": [], "structuredContent": {"n": 1}}) == ('{"n":1}', None)
    output, error = outcome({"content": [{"type": "text", "text": "no"}], "isError": True})
    assert output is None and error == {
        "type": "mcp_tool_execution_error",
        "content": [{"type": "text", "text": "no"}],
    }


def ips(*addresses: str) -> list[Any]:
    return [ipaddress.ip_address(a) for a in addresses]


def test_the_host_rule() -> None:
    default = HostRule.parse([])
    default.check("mcp.example.com", ips("93.184.216.34"))
    for private in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1"):
        with pytest.raises(Blocked):
            default.check("evil.example.com", ips(private))
    with pytest.raises(Blocked):  # one private address among public ones is enough
        default.check("mixed.example.com", ips("93.184.216.34", "192.168.1.1"))
    listed_rule = HostRule.parse(["127.0.0.1", "*.corp.internal", "10.1.0.0/16"])
    listed_rule.check("127.0.0.1", ips("127.0.0.1"))
    listed_rule.check("mcp.corp.internal", ips("10.9.9.9"))
    listed_rule.check("other", ips("10.1.2.3"))
    with pytest.raises(Blocked):  # once patterns are given, only what they match
        listed_rule.check("mcp.example.com", ips("93.184.216.34"))
    with pytest.raises(ValueError):
        HostRule.parse(["not a host!"])


def test_hosted_tools_the_gateway_cannot_run() -> None:
    tools = [{"type": "web_search"}, {"type": "function", "name": "f"}]
    assert hosted_check(tools, frozenset(), frozenset({"web_search"})) == ["web_search"]
    assert hosted_check(tools, frozenset({"web_search"}), frozenset()) == []
    with pytest.raises(RequestError) as error:
        hosted_check([{"type": "code_interpreter"}], frozenset(), frozenset({"web_search"}))
    assert error.value.param == "tools[0]" and "code_interpreter" in error.value.message


def test_the_echo_and_a_recording_never_show_headers(tmp_path: Any) -> None:
    secret = tool(headers={"Authorization": "Bearer s3cret"}, authorization="s3cret")
    assert "s3cret" not in repr(echo_tool(secret))
    recorder = ExchangeRecorder(tmp_path / "r.jsonl")
    recorder.client_request({"tools": [secret]})
    recorder.backend_request({"tools": [secret]})  # a backend that runs MCP itself
    recorder.close()
    assert b"s3cret" not in (tmp_path / "r.jsonl").read_bytes()
