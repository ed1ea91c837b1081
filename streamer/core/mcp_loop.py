"""The MCP loop of one turn, as decisions over plain values (pure).

A turn with `mcp` tools is a loop of backend answers inside one Response: the model calls
an MCP tool, the gateway runs it on its server (streamer/mcp/ is that I/O), the backend is
asked again with the call and its result, until the model answers without one. `McpTurn`
holds what the loop knows (the servers, their listed tools, the calls run so far, its
bounds); after each answer `plan` says, for each MCP call the answer made, whether it runs,
waits for the client's approval (an `mcp_approval_request`), or is refused (past the
response's call budget: `max_tool_calls`, `--mcp-max-calls`), and whether the backend is
asked again: only when every call ran and the answer called nothing the client must run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamer.core.mcp_history import Approval, approvals, listed
from streamer.core.mcp_items import ListedTool, http_error
from streamer.core.mcp_servers import McpServer, servers
from streamer.core.tool_decls import Decl

Action = Literal["run", "ask", "refuse"]
NORMAL_ENDS = (None, "stop", "tool_calls", "function_call", "end_turn", "tool_use")


@dataclass(frozen=True, slots=True)
class McpLimits:
    """The operator's bounds (`--mcp-*`)."""

    max_calls: int = 32  # MCP calls one response may run
    max_output_bytes: int = 1024 * 1024  # of one call's output
    timeout: float = 30.0  # seconds per MCP operation


@dataclass(frozen=True, slots=True)
class McpCall:
    """A call the model made to an MCP tool (a held call, decoded)."""

    label: str
    name: str
    arguments: str
    approval_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    call: McpCall
    error: dict[str, Any] | None = None  # a refused call's


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    again: bool  # ask the backend again once the steps are done


@dataclass(slots=True)
class McpTurn:
    """What the loop knows of one turn: plain values, built before it runs."""

    servers: dict[str, McpServer]
    tools: dict[str, dict[str, ListedTool]]  # label -> name -> tool (the allowed ones)
    new_lists: list[str] = field(default_factory=list)  # labels listed for this response
    approved: list[Approval] = field(default_factory=list)  # to run (or decline) first
    limits: McpLimits = field(default_factory=McpLimits)
    budget: int = 32  # calls this response may run (the least of the two bounds)
    calls: int = 0  # calls run (or started) so far
    exhausted: bool = False  # the budget is spent: the backend is asked without tools
    held: list[McpCall] | None = None  # the MCP calls of the answer that just ended
    answer_from: int = 0  # where the answer being read starts in the response's output
    base: list[dict[str, Any]] = field(default_factory=list)  # the input, as lowered

    def declarations(self) -> list[Decl]:
        """The allowed tools as the naming core declares them: one namespace per server."""
        out = []
        for label, tools in self.tools.items():
            preface = self.servers[label].description
            for tool in tools.values():
                text = tool.description
                if preface:
                    text = f"{preface}\n\n{text}" if text else preface
                out.append(Decl(label, tool.name, "mcp", text, tool.input_schema, None))
        return out

    def first_steps(self) -> list[Step]:
        """The calls the client approved in this request, run before the backend is asked
        (a declined one is only told to the model: core/mcp_history.py)."""
        steps = []
        for answer in self.approved:
            if not answer.approve:
                continue
            request = answer.request
            call = McpCall(
                str(request.get("server_label")),
                str(request.get("name")),
                str(request.get("arguments") or "{}"),
                str(request.get("id")),
            )
            steps.append(self._counted(call, approved=True))
        return steps

    def plan(self, held: Sequence[McpCall], client_calls: bool, finish: str | None) -> Plan:
        """What happens to the MCP calls one backend answer made. The backend is asked
        again only when every call ran (or was refused) and nothing waits for the client;
        an answer made without tools (the budget spent) that called anyway ends the turn."""
        spent = self.exhausted
        steps = tuple(self._counted(call) for call in held)
        again = (
            bool(steps)
            and not spent
            and not client_calls
            and finish in NORMAL_ENDS
            and not any(s.action == "ask" for s in steps)
        )
        return Plan(steps, again)

    def _counted(self, call: McpCall, approved: bool = False) -> Step:
        """One call's step; every call counts against the budget (so a model that keeps
        calling what does not exist still comes to an end)."""
        if self.calls >= self.budget:
            self.exhausted = True
            return Step("refuse", call, http_error(429, self._past_budget()))
        self.calls += 1
        self.exhausted = self.calls >= self.budget
        server = self.servers.get(call.label)
        tool = self.tools.get(call.label, {}).get(call.name)
        if server is None or tool is None:
            error = http_error(404, f"The MCP server '{call.label}' has no tool '{call.name}'.")
            return Step("refuse", call, error)
        if not approved and server.needs_approval(call.name, tool.read_only):
            return Step("ask", call)
        return Step("run", call)

    def _past_budget(self) -> str:
        return (
            f"This response may run at most {self.budget} MCP tool calls (max_tool_calls, "
            "--mcp-max-calls); this one was not run. Answer with what you have."
        )

    def continued(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The request the backend is asked again with: the model chooses freely (a forced
        tool_choice was for the first answer), or calls nothing once the budget is spent."""
        return {**request, "tool_choice": "none" if self.exhausted else "auto"}

    def call_limit(self) -> int:
        """The most calls the next answer may make (`first_calls`): what the budget leaves."""
        return max(1, self.budget - self.calls)


def budget(request: Mapping[str, Any], limits: McpLimits) -> int:
    """The MCP calls a response may run: `max_tool_calls` (OpenAI's bound on built-in tool
    calls) within the gateway's `--mcp-max-calls`."""
    asked = request.get("max_tool_calls")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return min(asked, limits.max_calls)
    return limits.max_calls


def setup(
    request: Mapping[str, Any],
    items: Sequence[dict[str, Any]],
    new_from: int,
    limits: McpLimits | None,
) -> McpTurn | None:
    """The loop's state for a request (None: it has no `mcp` tool): its servers (400s for a
    malformed one; any at all when `limits` is None, `--mcp off`), the tools its history
    listed already, the approvals its new items give."""
    tools_field = request.get("tools")
    found = servers(
        tools_field if isinstance(tools_field, list) else [], enabled=limits is not None
    )
    if not found or limits is None:
        return None
    known = listed(items)
    tools = {
        s.label: {t.name: t for t in known[s.label] if s.allows(t.name, t.read_only)}
        for s in found
        if s.label in known
    }
    return McpTurn(
        {s.label: s for s in found},
        tools,
        approved=approvals(items, new_from),
        limits=limits,
        budget=budget(request, limits),
    )
