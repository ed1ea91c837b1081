"""One turn as plain values: `prepare` builds it from a client's request, pure.

`prepare` validates the request, builds the tool map once, lowers the request for the
backend and builds the `OutputItemStreamer`; the `Turn` holds all of it. No I/O and no
asyncio here: `streamer/turns/turn_runner.py` runs a turn against its backend, `Gateway.run`
drives that for every transport and ends the turn.

The turn owns what a backend may make it hold: the streamer counts output characters
and items (`OutputLimits`), and the turn carries its deadline (`max_seconds`), which the
runner acts on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamer.core.compaction import (
    BACKEND_FIELD,
    REASONING_FIELD,
    Compactor,
    is_compaction,
    last_user_request,
)
from streamer.core.deltas import Usage
from streamer.core.events import Event
from streamer.core.hosted_tools import check as hosted_check
from streamer.core.lowering import LoweringOptions
from streamer.core.mcp_history import has_mcp, replayed
from streamer.core.mcp_loop import McpLimits, McpTurn
from streamer.core.mcp_loop import setup as mcp_setup
from streamer.core.mcp_servers import public_tools, wanted
from streamer.core.output import OutputItemStreamer
from streamer.core.output_items import OutputLimits
from streamer.core.request_checks import validate_request
from streamer.core.request_fields import echo_applied
from streamer.core.response import new_response
from streamer.core.sealing import REASONING_INCLUDE, Sealer
from streamer.core.tools import NamingConfig, ResponsesToolNames
from streamer.turns import history_reuse
from streamer.turns.history_reuse import HistoryCache
from streamer.turns.recorder import ExchangeRecorder
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.kind import BackendKind

log = logging.getLogger("streamer.turn")


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """Per-gateway settings that shape every turn."""

    naming: NamingConfig = field(default_factory=NamingConfig)
    lowering: LoweringOptions = field(default_factory=LoweringOptions)
    max_input_items: int = 10_000
    max_output_bytes: int = 16 * 1024 * 1024  # see OutputLimits
    max_output_items: int = 2048
    max_turn_seconds: float = 3600.0
    sealer: Sealer = field(default_factory=Sealer.random)  # encrypted_content (--state-key-file)
    kind: BackendKind = CHAT  # what the backend speaks (--upstream-api): its lowering
    mcp: McpLimits | None = field(default_factory=McpLimits)  # None: --mcp off
    optional_hosted: frozenset[str] = frozenset({"web_search"})  # --optional-hosted-tool
    # the turns kept for the turns that continue them (--history-cache-bytes); None: none
    history: HistoryCache | None = field(default=None, compare=False)


@dataclass(slots=True)
class Turn:
    """Everything one response needs, built once per request."""

    request: dict[str, Any]
    items: list[dict[str, Any]]  # the effective input: history, then the new items
    names: ResponsesToolNames
    backend_request: dict[str, Any]
    streamer: OutputItemStreamer
    headers: dict[str, str] = field(default_factory=dict)
    client: str = (
        ""  # who asked (streamer.core.identity): pools and stored responses are per client
    )
    max_seconds: float = 3600.0  # the turn's deadline, from its start (TurnOptions)
    compactor: Compactor | None = None  # a compaction turn (streamer/core/compaction.py)
    lowering: LoweringOptions = field(default_factory=LoweringOptions)  # for a re-lowering
    view: list[dict[str, Any]] = field(default_factory=list)  # items with sealed ones opened
    # `--tap-dir`: a recording opened before the turn runs (a background turn's, which holds
    # its `response.queued` and its cancel); its opener records the client events and closes it.
    recorder: ExchangeRecorder | None = None
    conversation: str | None = None  # the conversation this turn extends at its end
    new_from: int = 0  # where the request's own items start in `items` (after any history)
    route: object | None = None  # the model and affinity it is routed by (turns/registry.py)
    kind: BackendKind = CHAT  # the backend's kind: how a truncated retry is lowered again
    mcp: McpTurn | None = None  # its remote MCP servers' loop (core/mcp_loop.py)
    mcp_clients: object | None = None  # who runs it (streamer/mcp/client.py), set by the gateway
    replica: str = ""  # the replica that answered (genai_spans.replica_name), for logs and metrics
    # (previous response, n): `items[:n]` are its stored input as the store holds it (taken
    # from the kept turn, not read back): the record extends that one (records.py)
    stored_base: tuple[str, int] | None = None

    @property
    def response(self) -> dict[str, Any]:
        return self.streamer.response


def prepare(
    request: dict[str, Any],
    options: TurnOptions,
    *,
    history: Sequence[dict[str, Any]] = (),
    response_id: str | None = None,
    client: str = "",
) -> Turn:
    """Validate and lower one request. `history` is the continued response's input+output;
    `client`: who asks (streamer.core.identity): its sealed items open only for it, and a
    conversation's kept lowering is its alone."""
    validate_request(request, model_required=options.lowering.model is None)
    # null means "not given" in OpenAI's API: the Response echoes the default, never null
    request = {k: v for k, v in request.items() if v is not None}
    options = _reuse_options(request, options)  # an MCP turn is lowered in full
    # validated and opened (a 400 for a sealed item that does not open), only past what an
    got = history_reuse.inputs(request, options, history, client)  # earlier turn did already
    request, mcp = _mcp(request, got, len(history), options)
    new_items, items, view, names = got.new_items, got.items, got.view, got.names
    if names is None:
        names = ResponsesToolNames.convert(request.get("tools"), view, config=options.naming)
    if mcp is not None:
        names.declare(mcp.declarations())  # the tools the history listed already
    compactor = None
    if is_compaction(new_items):
        backend_request = options.kind.compaction(request, view, names, options.lowering)
        last = last_user_request(items)
        compactor = Compactor(options.sealer, last, options.max_output_bytes, client)
    else:
        backend_request = _lowered(request, mcp, got, names, options)
    response = new_response(request, response_id=response_id)
    if compactor is None:
        history_reuse.keep(got, backend_request, names, response["id"], options)
    echo_applied(response, backend_request)
    limits = OutputLimits(options.max_output_bytes, options.max_output_items)
    prompt = {k: backend_request[k] for k in options.kind.prompt_keys if k in backend_request}
    streamer = OutputItemStreamer(
        names,
        response,
        limits=limits,
        prompt=prompt,
        seal_reasoning=_reasoning_sealer(request, options, client),
        reasoning_summary=_unnamed_reasoning(request, options),
    )
    mcp = mcp if compactor is None else None  # a compaction's answer is a summary, no call
    streamer.hold = frozenset({"mcp"}) if mcp is not None else frozenset()
    return Turn(
        request,
        items,
        names,
        backend_request,
        streamer,
        client=client,
        max_seconds=options.max_turn_seconds,
        compactor=compactor,
        lowering=options.lowering,
        view=view,
        kind=options.kind,
        mcp=mcp,
    )


def _lowered(
    request: dict[str, Any],
    mcp: McpTurn | None,
    got: history_reuse.Inputs,
    names: ResponsesToolNames,
    options: TurnOptions,
) -> dict[str, Any]:
    """The backend request (its own 400s first: a tool_choice forcing a hosted tool); then
    a hosted tool the backend cannot run is a 400, or left out (logged) when optional."""
    lowered = history_reuse.lower(_unlisted(request, mcp), got, names, options)
    tools = request.get("tools")
    if isinstance(tools, list):
        left_out = hosted_check(tools, options.lowering.tools.hosted, options.optional_hosted)
        if left_out:
            log.info("hosted tools left out (--optional-hosted-tool): %s", ", ".join(left_out))
    return lowered


def _reuse_options(request: dict[str, Any], options: TurnOptions) -> TurnOptions:
    """`options`, without the kept lowerings for a turn with MCP servers: its tools and its
    history change as it runs (listed tools, MCP items replayed as calls)."""
    return replace(options, history=None) if wanted(request) else options


def _unlisted(request: dict[str, Any], mcp: McpTurn | None) -> dict[str, Any]:
    """The request as lowered before its MCP servers are listed: its `tool_choice` may name
    their tools, so it waits (and is checked) until they are (streamer/mcp/steps.py)."""
    if mcp is None or "tool_choice" not in request:
        return request
    return {k: v for k, v in request.items() if k != "tool_choice"}


def _mcp(
    request: dict[str, Any], got: history_reuse.Inputs, new_from: int, options: TurnOptions
) -> tuple[dict[str, Any], McpTurn | None]:
    """The request's MCP loop (None: it has no `mcp` tool, or its backend runs them itself)
    and the request with its `mcp` tools in their public form (the servers' headers are kept
    in the loop only: never echoed or stored); the history's MCP items are shown as calls
    (`got.view`)."""
    mcp = None
    if wanted(request) and "mcp" not in options.lowering.tools.hosted:
        mcp = mcp_setup(request, got.view, new_from, options.mcp)
    if mcp is not None:
        request = {**request, "tools": public_tools(request["tools"])}
    if mcp is not None or (got.resumed is None and has_mcp(got.view)):
        got.view = replayed(got.view)
    return request, mcp


def _unnamed_reasoning(request: dict[str, Any], options: TurnOptions) -> int | None:
    """Where a backend's reasoning goes when its stream does not say (Chat's
    `reasoning_content`, Messages' thinking): the summary when the client asked for one
    (Codex, the AI SDK show summaries only), else the raw `reasoning_text` content.
    Never both: a client that reads both would show it twice."""
    if options.kind.names_reasoning_parts:
        return None
    reasoning = request.get("reasoning")
    if not isinstance(reasoning, dict):
        return None
    asked = reasoning.get("summary", reasoning.get("generate_summary"))
    return 0 if asked in ("auto", "concise", "detailed") else None


def _reasoning_sealer(
    request: dict[str, Any], options: TurnOptions, owner: str
) -> Callable[[str, str | None], str] | None:
    """Reasoning items carry their text sealed when the client asks for it (with a
    Responses backend's own blob, when it sent one)."""
    include = request.get("include")
    if not isinstance(include, list) or REASONING_INCLUDE not in include:
        return None
    sealer = options.sealer

    def seal(text: str, backend: str | None) -> str:
        extra = {BACKEND_FIELD: backend} if backend else None
        return sealer.seal("reasoning", REASONING_FIELD, text, extra, owner=owner)

    return seal


def warmup(turn: Turn) -> list[Event]:
    """WebSocket `generate:false`: created then completed, empty output, no backend call
    (so no usage at all, not an estimate)."""
    events = turn.streamer.start(in_progress=False)
    turn.streamer.feed([Usage()])
    return events + turn.streamer.finish()
