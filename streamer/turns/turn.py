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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from streamer.core.lowering import LoweringOptions
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
    # validated and opened (a 400 for a sealed item that does not open), only past what an
    # earlier turn of the conversation did already (streamer/turns/history_reuse.py)
    got = history_reuse.inputs(request, options, history, client)
    new_items, items, view, names = got.new_items, got.items, got.view, got.names
    if names is None:
        names = ResponsesToolNames.convert(request.get("tools"), view, config=options.naming)
    compactor = None
    if is_compaction(new_items):
        backend_request = options.kind.compaction(request, view, names, options.lowering)
        last = last_user_request(items)
        compactor = Compactor(options.sealer, last, options.max_output_bytes, client)
    else:
        backend_request = history_reuse.lower(request, got, names, options)
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
    )


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
