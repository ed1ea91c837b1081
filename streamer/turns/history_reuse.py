"""A turn that continues a conversation lowers only what is new in it (pure, bounded).

A conversation's turns repeat each other: the WebSocket mode and `previous_response_id`
continue a response whose own input the gateway lowered a moment ago, and a client that
replays the whole history (Codex over HTTP, `store: false`) sends the last turn's input
again, then what came of it. Validating, opening, naming and lowering those items again
costs ~1 µs of Python an item, every turn, and encoding them again for the backend as much
again in C. So a turn's lowering is kept (`HistoryCache`, `--history-cache-bytes`): its
effective items, their opened view, the tool map after them, and the Chat builder's state
with the bytes of the messages so far (core/chat_messages.py, core/wire_messages.py). A
later turn resumes from it when its own items start with those items, in the same context
(client, backend kind, the model's lowering, naming, tools, instructions):

- `continued`: the turn names the response by `previous_response_id` and its history
  starts with the items that response's turn was lowered from (the same objects for the
  WebSocket's remembered responses: the check is a comparison of pointers);
- `replayed`: a turn with no history whose `input` starts with the `input` of one of the
  last turns in the same context (compared as values, in C).

Only the rest is validated, opened and lowered: the answer is the plain lowering's, byte for
byte (tests/test_history_reuse.py holds every path to it). A new item that reaches back into
what came before (a compaction, an item declaring tools) makes the turn a plain one.
Short inputs (`MIN_ITEMS`) are neither kept nor looked up: they cost less than keeping.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from streamer.core.compaction import COMPACTION_TYPES, restore
from streamer.core.errors import invalid
from streamer.core.input_items import normalize_input
from streamer.core.lowering import LoweringOptions
from streamer.core.media_parts import check_media
from streamer.core.sealing import Sealer
from streamer.core.tool_templates import SOURCE_ITEMS
from streamer.core.tools import NamingConfig, ResponsesToolNames
from streamer.core.wire_messages import lowered_key
from streamer.store.base import visible
from streamer.upstream.kind import BackendKind

MIN_ITEMS = 16  # inputs shorter than this are lowered in full, and not kept
CANDIDATES = 4  # replayed: the last turns of one context tried (parallel conversations)
ITEM_OVERHEAD = 64  # bytes an item costs a kept turn beyond its messages' bytes (pointers)
_REACHES_BACK = frozenset((*COMPACTION_TYPES, *SOURCE_ITEMS))

Context = tuple[Any, ...]


class TurnOptions(Protocol):
    """What this module reads of the turn options (streamer/turn.py `TurnOptions`)."""

    @property
    def history(self) -> HistoryCache | None: ...
    @property
    def kind(self) -> BackendKind: ...
    @property
    def lowering(self) -> LoweringOptions: ...
    @property
    def naming(self) -> NamingConfig: ...
    @property
    def sealer(self) -> Sealer: ...
    @property
    def max_input_items(self) -> int: ...


@dataclass(slots=True)
class Kept:
    """One turn's lowering, as a later turn resumes it; and, once its response is stored,
    its input as the store holds it (`stored`: the same items as listed, with their ids),
    so that a continuation by `previous_response_id` need not read it back."""

    context: Context  # holds the model's lowering and naming options: their ids stay theirs
    items: list[dict[str, Any]]  # the turn's effective input (its own list: never changed)
    raw: list[Any] | None  # its `input` as sent, when it had no history (`replayed`'s key)
    view: list[dict[str, Any]]  # `items` opened (compaction.restore; `items` if none sealed)
    names: ResponsesToolNames  # the tool map after lowering them (a copy)
    state: Any  # where the lowering resumes (core/chat_messages.py MessagesState)
    size: int  # what it holds, roughly, in bytes
    refs: tuple[Any, ...] = ()  # the options whose ids are in `context`
    stored: list[dict[str, Any]] | None = None  # `items` as stored (`recorded`)
    owner: str | None = None  # whose stored response it is
    affinity: str | None = None  # the replica-affinity key its record holds
    # the history last made from it (`continuation`): a turn given that very sequence
    # starts with its items by construction, and is not compared item by item
    history: Sequence[dict[str, Any]] | None = None
    made_from: Sequence[dict[str, Any]] | None = None  # `items` or `stored`: which it was


class HistoryCache:
    """The kept turns, by response id, least recently used first; at most `max_bytes` in
    all (their messages' bytes and `ITEM_OVERHEAD` an item; a replayed input's own objects
    counted as much again); 0 keeps nothing."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._recent: dict[Context, deque[str]] = {}  # replayable turns by context

    def __len__(self) -> int:
        return len(self._kept)

    def continued(
        self, previous: str, context: Context, history: Sequence[Any], stored: bool = True
    ) -> Kept | None:
        """The kept turn `previous` if `history` starts with its items (or, if `stored`, its
        stored ones), in `context`."""
        kept = self._kept.get(previous)
        if kept is None or kept.context != context:
            return None
        if history is kept.history:
            fits = stored or kept.made_from is kept.items
        else:
            fits = _starts(history, kept, stored)
        if not fits:
            return None
        self._kept.move_to_end(previous)
        self.hits += 1
        return kept

    def recorded(
        self,
        response_id: str,
        owner: str | None,
        items: list[dict[str, Any]],
        affinity: str | None = None,
    ) -> None:
        """The turn `response_id` was stored with `items` as its input (its own items as
        listed, ids given): a continuation may take them from here (`stored_input`)."""
        kept = self._kept.get(response_id)
        if kept is None or kept.stored is not None or len(items) != len(kept.items):
            return
        kept.stored, kept.owner, kept.affinity = items, owner, affinity
        grown = ITEM_OVERHEAD * len(items)
        kept.size += grown
        self.bytes += grown
        self._trim()

    def stored_input(
        self, response_id: str, owner: str | None
    ) -> tuple[list[dict[str, Any]], str | None] | None:
        """The stored input of the kept turn `response_id` and its record's affinity key,
        if `owner` may see it (the store's rule; the caller still asks the store whether
        the response is there)."""
        kept = self._kept.get(response_id)
        if kept is None or kept.stored is None or not visible(kept.owner, owner):
            return None
        return kept.stored, kept.affinity

    def continuation(
        self, response_id: str, items: Sequence[dict[str, Any]], output: Sequence[dict[str, Any]]
    ) -> tuple[dict[str, Any], ...]:
        """`(*items, *output)`: the history that continues `response_id`, marked as made
        from its kept turn (`items`: that turn's own items, or its stored ones)."""
        history = (*items, *output)
        kept = self._kept.get(response_id)
        if kept is not None and (items is kept.items or items is kept.stored):
            kept.history, kept.made_from = history, items
        return history

    def replayed(self, context: Context, raw: list[Any]) -> Kept | None:
        """The latest kept turn of `context` whose `input` starts `raw` (its last item
        compared first: another conversation of the context differs there, or sooner)."""
        for response_id in reversed(self._recent.get(context, ())):
            kept = self._kept.get(response_id)
            if kept is None or kept.raw is None or kept.context != context:
                continue
            if _starts_input(raw, kept.raw):
                self._kept.move_to_end(response_id)
                self.hits += 1
                return kept
        return None

    def put(self, response_id: str, kept: Kept) -> None:
        if kept.size > self.max_bytes:
            return
        self._kept[response_id] = kept
        self.bytes += kept.size
        if kept.raw is not None:
            recent = self._recent.get(kept.context)
            if recent is None:
                recent = self._recent[kept.context] = deque(maxlen=CANDIDATES)
            recent.append(response_id)
        self._trim()

    def _trim(self) -> None:
        while self.bytes > self.max_bytes:
            self._drop(*self._kept.popitem(last=False))

    def _drop(self, response_id: str, kept: Kept) -> None:
        self.bytes -= kept.size
        recent = self._recent.get(kept.context) if kept.raw is not None else None
        if recent is not None:
            if response_id in recent:
                recent.remove(response_id)
            if not recent:
                del self._recent[kept.context]


@dataclass(slots=True)
class Inputs:
    """A turn's items: the request's own (`new_items`), the effective input, its opened
    view, the tool map when it came from a kept turn, and what resuming and keeping need."""

    new_items: list[dict[str, Any]]
    items: list[dict[str, Any]]
    view: list[dict[str, Any]]
    names: ResponsesToolNames | None = None  # None: converted from the tools as usual
    resumed: Kept | None = None
    context: Context | None = None  # None: neither resumed nor kept
    raw: list[Any] | None = None  # `input` as sent, when the turn has no history


def _starts_input(raw: list[Any], known: list[Any]) -> bool:
    """Whether `raw` starts with the items of `known` (a kept turn's `input`): a replayed
    body's `input` made on that very list does (core/replayed_json.py `KnownInput`); any
    other is compared, its last item first."""
    n = len(known)
    if n == 0:
        return False
    if getattr(raw, "source", None) is known:
        return True
    return n <= len(raw) and raw[n - 1] == known[-1] and raw[:n] == known


def _starts(history: Sequence[Any], kept: Kept, stored: bool) -> bool:
    """Whether `history` starts with `kept`'s items, or (if `stored`) its stored ones (as
    values)."""
    n = len(kept.items)
    if len(history) < n:
        return False
    head = list(history[:n])
    return head == kept.items or (stored and kept.stored is not None and head == kept.stored)


def context(request: Mapping[str, Any], options: TurnOptions, client: str) -> Context | None:
    """What a kept turn must share with this one to be resumed by it; None: this turn's
    lowering is not kept (no cache, a kind that does not resume, tools it cannot key)."""
    if options.history is None or options.kind.resuming is None:
        return None
    tools, instructions = request.get("tools"), request.get("instructions")
    if instructions is not None and instructions.__class__ is not str:
        return None  # lowering's 400
    try:
        key = orjson.dumps(tools) if tools is not None else b""
    except TypeError:  # a value orjson cannot encode: the plain path reports it
        return None
    lowering, naming = options.lowering, options.naming
    return (client, options.kind.name, id(lowering), id(naming), key, instructions or "")


def inputs(
    request: Mapping[str, Any], options: TurnOptions, history: Sequence[dict[str, Any]], client: str
) -> Inputs:
    """Validate and open the turn's items, resuming a kept turn's work where one fits."""
    raw = request.get("input", [])
    ctx = context(request, options, client) if len(history) + _length(raw) >= MIN_ITEMS else None
    kept = _find(options, ctx, request, history, raw) if ctx is not None else None
    if kept is not None:
        got = _resume(kept, options, history, raw, client)
        if got is not None:
            got.context = ctx
            return got
    new_items = normalize_input(raw)
    check_media(new_items, file_parts=options.lowering.file_parts)
    items = [*history, *new_items] if history else new_items
    _count(items, options)
    view = restore(items, options.sealer, offset=len(history), owner=client)
    return Inputs(new_items, items, view, context=ctx, raw=_replayable(raw, history))


def _length(raw: Any) -> int:
    return len(raw) if isinstance(raw, list) else 1


def _replayable(raw: Any, history: Sequence[Any]) -> list[Any] | None:
    return raw if not history and isinstance(raw, list) else None


def _find(
    options: TurnOptions,
    ctx: Context,
    request: Mapping[str, Any],
    history: Sequence[dict[str, Any]],
    raw: Any,
) -> Kept | None:
    cache, kind = options.history, options.kind
    if cache is None:
        return None
    if history:
        previous = request.get("previous_response_id")
        if not isinstance(previous, str):
            return None
        return cache.continued(previous, ctx, history, stored=kind.resumes_stored)
    return cache.replayed(ctx, raw) if isinstance(raw, list) else None


def _resume(
    kept: Kept,
    options: TurnOptions,
    history: Sequence[dict[str, Any]],
    raw: Any,
    client: str,
) -> Inputs | None:
    """The turn's items past `kept`'s, validated and opened; None when one of them
    reaches back into `kept`'s (a compaction, tools declared by an item)."""
    n, file_parts = len(kept.items), options.lowering.file_parts
    if history:
        new_items = normalize_input(raw)
        check_media(new_items, file_parts=file_parts)
        rest = [*history[n:], *new_items]
        items = [*history, *new_items]
    else:
        rest = normalize_input(raw[n:], n)
        check_media(rest, file_parts=file_parts, start=n)
        new_items = items = [*kept.items, *rest]
    if any(item.get("type") in _REACHES_BACK for item in rest):
        return None
    _count(items, options)
    opened = restore(rest, options.sealer, offset=len(history), owner=client, start=n)
    # nothing sealed: the view is the input itself, as `restore` makes it
    view = items if kept.view is kept.items and opened is rest else [*kept.view, *opened]
    names = kept.names.copy()
    return Inputs(new_items, items, view, names, kept, raw=_replayable(raw, history))


def _count(items: list[dict[str, Any]], options: TurnOptions) -> None:
    if len(items) > options.max_input_items:
        raise invalid(
            f"Too many input items: {len(items)} (at most {options.max_input_items}).", "input"
        )


def lower(
    request: dict[str, Any], got: Inputs, names: ResponsesToolNames, options: TurnOptions
) -> dict[str, Any]:
    """The backend request: the kind's lowering, resumed from the kept turn and kept
    itself where `got` says so."""
    resuming = options.kind.resuming
    if got.context is None or resuming is None:
        return options.kind.lower(request, got.view, names, options.lowering)
    state = got.resumed.state if got.resumed is not None else None
    return resuming(request, got.view, names, options.lowering, resume=state, keep=True)


def keep(
    got: Inputs,
    backend_request: Mapping[str, Any],
    names: ResponsesToolNames,
    response_id: str,
    options: TurnOptions,
) -> None:
    """Keep the turn's lowering for the turns that continue it (before it runs: the tool
    map is copied before the turn adds spellings to it)."""
    name = lowered_key(backend_request)
    state = backend_request[name].state if name is not None else None
    if got.context is None or options.history is None or state is None:
        return
    size = state.encoded.size * (2 if got.raw is not None else 1) + ITEM_OVERHEAD * len(got.items)
    kept = Kept(
        got.context, got.items, got.raw, got.view, names.copy(), state, size,
        (options.lowering, options.naming),
    )  # fmt: skip
    options.history.put(response_id, kept)
