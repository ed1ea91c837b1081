"""A turn's MCP steps around its backend answers: the I/O over core/mcp_loop.py's decisions.

Before the first answer `prepare` lists the servers not listed yet in the chain (a 424
naming the server when one cannot be), declares their allowed tools to the naming core,
runs the calls the client approved in this request and lowers the backend request with
them; `announce` then gives their items once `response.created` is out. After an answer
that called MCP tools, `between` runs what `McpTurn.plan` says (each call's item streamed:
added, in progress, its arguments, then completed or failed once its server answered; an
`mcp_approval_request` for a call that waits) and says whether the backend is asked again
(`lowered` is that request). Every wait goes through `wait`, the turn's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson

from streamer.core.events import Event
from streamer.core.mcp_history import replayed
from streamer.core.mcp_items import (
    ListedTool,
    approval_item,
    call_ended,
    call_item,
    call_started,
    list_events,
    list_item,
    protocol_error,
)
from streamer.core.mcp_loop import McpCall, McpTurn, Step
from streamer.core.mcp_servers import refusal
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_id
from streamer.mcp.client import McpClients, McpUnavailable
from streamer.turns.turn import Turn

T = TypeVar("T")
Wait = Callable[[Awaitable[T]], Awaitable[T]]
Done = tuple[dict[str, Any], str | None, dict[str, Any] | None]  # a call item, output, error
CLIENT_CALLS = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call"}
)


def _loop(turn: Turn) -> tuple[McpTurn, McpClients]:
    mcp, clients = turn.mcp, turn.mcp_clients
    assert mcp is not None and isinstance(clients, McpClients)
    return mcp, clients


async def prepare(turn: Turn, wait: Wait[Any]) -> list[Done]:
    """List what is not listed yet, declare the tools, run the approved calls; the backend
    request is lowered again with them. The approved calls' results, for `announce`."""
    mcp, clients = _loop(turn)
    todo = [s for label, s in mcp.servers.items() if label not in mcp.tools]
    found = await wait(
        asyncio.gather(*(clients.list_tools(s) for s in todo), return_exceptions=True)
    )
    for server, result in zip(todo, found, strict=True):
        if isinstance(result, McpUnavailable):
            raise refusal(server, str(result))
        if isinstance(result, BaseException):
            raise result
        allowed = [t for t in result if server.allows(t.name, t.read_only)]
        mcp.tools[server.label] = {t.name: t for t in allowed}
        mcp.new_lists.append(server.label)
    turn.names.declare(mcp.declarations())
    ran: list[Done] = []
    for step in mcp.first_steps():
        item = call_item(new_id("mcp"), step.call.label, step.call.name, step.call.arguments)
        item["approval_request_id"] = step.call.approval_request_id
        output, error = await _outcome(step, clients, mcp, wait)
        ran.append((item, output, error))
    mcp.base = list(turn.view or turn.items)
    turn.backend_request = lowered(turn, [call_ended(i, o, e)[1] for i, o, e in ran], first=True)
    return ran


def announce(turn: Turn, ran: Sequence[Done]) -> list[Event]:
    """The new lists' items and the approved calls' items, after `response.created`."""
    mcp, streamer = turn.mcp, turn.streamer
    assert mcp is not None
    events: list[Event] = []
    for label in mcp.new_lists:
        tools: list[ListedTool] = list(mcp.tools[label].values())
        events += _emit(streamer, list_events(list_item(new_id("mcpl"), label, tools)))
    for item, output, error in ran:
        events += _emit(streamer, (*call_started(item), *call_ended(item, output, error)))
    mcp.answer_from = len(turn.response["output"])
    return events


def _emit(streamer: OutputItemStreamer, parts: Sequence[dict[str, Any]]) -> list[Event]:
    """An item the gateway makes: added (the first), its events, done (the last)."""
    events = streamer.add_item(parts[0])
    for event in parts[1:-1]:
        events += streamer.item_event(event)
    return events + streamer.done_item(parts[-1])


def lowered(turn: Turn, extra: Sequence[dict[str, Any]], *, first: bool = False) -> dict[str, Any]:
    """The backend request for the next answer: the input, the output so far (and `extra`),
    MCP items shown as calls and results; the model chooses freely after the first."""
    mcp = turn.mcp
    assert mcp is not None
    output = [*turn.response["output"], *extra]
    items = [*mcp.base, *replayed(output)]
    turn.view = items  # what a truncated retry or a fallback model is lowered from
    request = turn.request if first else mcp.continued(turn.request)
    return turn.kind.lower(request, items, turn.names, turn.lowering)


def held_calls(turn: Turn, calls: Sequence[Any]) -> list[McpCall]:
    """The calls `end_answer` held, as MCP calls (server label, tool name, arguments)."""
    out = []
    for call in calls:
        identity = turn.names.decode(call.name)
        out.append(McpCall(identity.namespace or "", identity.name, "".join(call.args)))
    return out


async def between(turn: Turn, wait: Wait[Any]) -> AsyncGenerator[list[Event] | None, None]:
    """The steps after an answer that called MCP tools, as batches of events; the last
    is None when the backend is to be asked again (`lowered`), else the turn's end."""
    mcp, clients = _loop(turn)
    streamer = turn.streamer
    held, mcp.held = mcp.held or [], None
    answer = turn.response["output"][mcp.answer_from :]
    client_calls = any(item.get("type") in CLIENT_CALLS for item in answer)
    plan = mcp.plan(held, client_calls, streamer.answer_finish)
    for step in plan.steps:
        call = step.call
        if step.action == "ask":
            request = approval_item(new_id("mcpr"), call.label, call.name, call.arguments)
            yield _emit(streamer, (request, request))
            continue
        item = call_item(new_id("mcp"), call.label, call.name, call.arguments)
        started = call_started(item)
        events = streamer.add_item(started[0])
        for event in started[1:]:
            events += streamer.item_event(event)
        yield events
        output, error = await _outcome(step, clients, mcp, wait)
        end, done = call_ended(item, output, error)
        yield streamer.item_event(end) + streamer.done_item(done)
    if plan.again:
        mcp.answer_from = len(turn.response["output"])
        yield None
    else:
        yield streamer.finish()


async def _outcome(
    step: Step, clients: McpClients, mcp: McpTurn, wait: Wait[Any]
) -> tuple[str | None, dict[str, Any] | None]:
    """A step's `(output, error)`: the server's answer when it runs, else its refusal."""
    if step.action != "run":
        return None, step.error
    call = step.call
    try:
        arguments = orjson.loads(call.arguments or "{}")
    except orjson.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        return None, protocol_error(-32602, "The call's arguments are not a JSON object.")
    return await wait(clients.call_tool(mcp.servers[call.label], call.name, arguments))
