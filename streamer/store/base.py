"""The response store interface, its record type and the small pure helpers both stores share."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import orjson

from streamer.core.call_kinds import CALL_KINDS
from streamer.core.events import STREAM_END_TYPES

Order = Literal["asc", "desc"]
Incomplete = Callable[[str], None]
"""Told what was found incomplete (`record`, `events`): the gateway counts it (a metric)."""

log = logging.getLogger("streamer.store")

# Id prefixes for input items stored without an id (input_items pages need a cursor): a
# call's and its output's are its kind's (streamer/core/call_kinds.py).
_ITEM_PREFIXES = {
    "message": "msg",
    "reasoning": "rs",
    **{row.call_type: row.id_prefix for row in CALL_KINDS.values()},
    **{row.output_type: row.output_prefix for row in CALL_KINDS.values()},
    "additional_tools": "at",
    "compaction": "cmp",
}


class StoreUnavailable(Exception):
    """The store cannot be reached or did not answer in time (the shell answers 503)."""


class IncompleteRecord(StoreUnavailable):
    """What the store holds of a response is not all it wrote (an event log that lost
    entries, evicted by the server): raised by a follower's read, never served as whole."""


@dataclass(slots=True)
class StoredResponse:
    """What a stored response keeps: the Response, its input as listed, and its owner.

    `owner` is the identity of the client that created it (streamer/core/identity.py); "" (an
    anonymous gateway) or None (a record older than owners) belongs to everyone.
    `affinity` is the replica-affinity key its turn was routed by (core/routing.py), so a
    continuation keeps to that replica on whichever instance it arrives at.
    """

    response: dict[str, Any]
    input_items: list[dict[str, Any]] = field(default_factory=list)
    owner: str | None = None
    affinity: str | None = None
    # a hint: its first n input items are the record `id`'s, as stored (ids and all), so a
    # store may share what it holds of them (the memory store does) instead of encoding
    # them again; a store may ignore it
    extends: tuple[str, int] | None = None

    @property
    def id(self) -> str:
        return str(self.response["id"])


def visible(record_owner: str | None, owner: str | None) -> bool:
    """Whether a record owned by `record_owner` exists for the client `owner`.

    `owner=None` is the gateway itself (background turns, cancels): it sees everything.
    Another client's record is, for a client, a record that does not exist (a 404, as
    OpenAI answers across projects), so nobody learns which ids are taken.
    """
    return owner is None or not record_owner or record_owner == owner


@runtime_checkable
class ResponseStore(Protocol):
    """Stored responses, background event logs and cancellation, shared by every instance.

    The lookups take `owner` (a client identity): a record another client owns reads as
    absent (None, False). Without it they see every record.

    A record is whole or absent: a store never hands out part of what one `put` wrote (a
    record the server evicted in part reads as absent, and is counted and logged).

    `shared`: other gateway instances see what this one writes (Redis); `durable`: it
    outlives this process (Redis, SQLite). The memory store is neither.
    """

    shared: bool
    durable: bool

    async def put(self, record: StoredResponse) -> None:
        """Create or replace; input items lacking an `id` are stored with a fresh one."""

    async def get(self, response_id: str, *, owner: str | None = None) -> StoredResponse | None: ...

    async def get_response(
        self, response_id: str, *, owner: str | None = None
    ) -> dict[str, Any] | None:
        """Only the Response object (the cheap path for GET /v1/responses/{id})."""

    async def delete(self, response_id: str, *, owner: str | None = None) -> bool:
        """Forget the record, its events and its cancel flag; False if there was no record."""

    async def get_item(self, item_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        """An input or output item of a stored response, by its id (`item_reference`);
        None when no live record `owner` may see holds it."""

    async def input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any] | None:
        """One `{object:"list", data, first_id, last_id, has_more}` page; None for unknown ids.

        `desc` lists the newest item first; `after` is an item id and the page starts just
        past it in the chosen order (an unknown `after` gives an empty page).
        """

    async def append_event(self, response_id: str, seq: int, data: bytes) -> None:
        """Log one encoded event. Seqs must increase; a seq at or below the last one, or any
        append after the stream ended, is ignored (so retries are harmless)."""

    def events(self, response_id: str, *, after: int = -1) -> AsyncIterator[tuple[int, bytes]]:
        """Logged events with seq > `after`, then live ones, ending after the terminal event
        or `end_events`. Ends at once if neither a record nor a log exists for the id."""
        ...

    async def end_events(self, response_id: str) -> None:
        """Mark the log finished so followers stop even without a terminal event."""

    async def request_cancel(self, response_id: str) -> None: ...

    async def wait_cancel(self, response_id: str) -> None:
        """Return once anyone, on any instance, asked to cancel (before or after this call)."""

    async def last_seq(self, response_id: str) -> int | None:
        """The seq of the last event logged for the response (-1: none yet); None once its
        log ended (a terminal event or `end_events`: nothing more can be logged)."""

    # -- leases of running background turns (streamer/frontends/leases.py) -------------------

    async def hold_lease(self, response_id: str, holder: str, seconds: float) -> bool:
        """Take the response's lease for `seconds`, or renew it: True while `holder` has it
        (it was free, lapsed with nobody else taking it, or is its own already); False once
        another holder has it. Taking it lists the id (`lapsed_leases`) until it is
        released. One atomic step on the store: of two holders, one wins."""

    async def lease_alive(self, response_id: str) -> bool:
        """Whether somebody holds the response's lease now."""

    async def release_lease(self, response_id: str, holder: str | None) -> None:
        """The id off the list of leases; the lease itself let go if `holder` has it (None:
        kept until it lapses)."""

    async def lapsed_leases(self, limit: int) -> list[str]:
        """At most `limit` listed ids whose lease lapsed (nobody renewed it in time)."""

    async def ping(self) -> bool:
        """Whether the store takes a write now (it writes a small probe; `/readyz`)."""

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        """The secret kept under `name`, or `candidate`, kept now if none was (set if
        absent): every instance on one shared store gets the same, and a durable store keeps
        it across restarts. It never expires (the state key: streamer/core/sealing.py)."""

    async def check(self) -> list[str]:
        """What an operator should change in the store's own configuration (logged as
        warnings at startup); [] when nothing, or when it cannot be read."""

    async def close(self) -> None: ...


def why(exc: BaseException) -> str:
    """A failure as a log line reads it: its type, and its message when it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def report_incomplete(hook: Incomplete | None, what: str, response_id: str, why: str) -> None:
    """A record or event log found incomplete: logged, counted, then served as missing."""
    noun = "event log" if what == "events" else what
    log.warning("store: the %s of %s is incomplete (%s): treated as missing", noun,
                response_id, why)  # fmt: skip
    if hook is not None:
        hook(what)


def record_item_ids(response: dict[str, Any], items: Sequence[dict[str, Any]]) -> list[str]:
    """The ids a record answers `get_item` for: its input items' and its output items'."""
    output = response.get("output")
    every = [*items, *(output if isinstance(output, list) else ())]
    ids = (item.get("id") for item in every if isinstance(item, dict))
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and i))


def input_ids(items: Sequence[dict[str, Any]]) -> list[str]:
    """The ids of input items stored with one (`with_item_ids`), those that are strings."""
    return [i for i in (item.get("id") for item in items) if isinstance(i, str) and i]


def find_item(record: StoredResponse, item_id: str) -> dict[str, Any] | None:
    """The record's item with this id, its output first (the latest form of an item)."""
    output = record.response.get("output")
    for item in [*(output if isinstance(output, list) else ()), *record.input_items]:
        if isinstance(item, dict) and item.get("id") == item_id:
            return item
    return None


def new_item_id(item: dict[str, Any]) -> str:
    kind = item.get("type") or ("message" if "role" in item else "item")
    return f"{_ITEM_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"


def with_item_ids(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items, each with an `id`; items lacking one are copied, never mutated."""
    return [item if item.get("id") else {**item, "id": new_item_id(item)} for item in items]


_TYPE_FIRST = b'{"type":"'
_AFTER_VALUE = frozenset((b",", b"}"))


def event_type(data: bytes) -> str | None:
    """The `type` of a logged event (a JSON object), or None when it has none.

    Any encoder's output is read right: the quick read applies only when the object's
    first member is `"type"` with a string value free of escapes and ends there, which
    gives the value JSON itself gives (names are unique in an event); anything else is
    parsed. The quick read spares parsing a terminal event, which holds the whole
    response. tests/test_event_type.py checks it against the parse.
    """
    if data.startswith(_TYPE_FIRST):
        end = data.find(b'"', 9)  # 9: len(_TYPE_FIRST)
        raw = data[9:end]
        if end > 0 and data[end + 1 : end + 2] in _AFTER_VALUE and 92 not in raw:  # 92: "\\"
            try:
                return raw.decode()
            except UnicodeDecodeError:  # no JSON: the parse below says so
                pass
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def is_terminal(data: bytes) -> bool:
    """Whether the logged event ends its stream (`STREAM_END_TYPES`: a terminal event or a
    bare `error`)."""
    return event_type(data) in STREAM_END_TYPES


def check_page_args(limit: int, order: str) -> None:
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if order not in ("asc", "desc"):
        raise ValueError("order must be 'asc' or 'desc'")


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": has_more,
    }


def page_items(
    items: Sequence[dict[str, Any]], *, limit: int, order: Order, after: str | None
) -> dict[str, Any]:
    """Page over items kept in input order (the reference the Redis store's arithmetic matches)."""
    check_page_args(limit, order)
    ordered = list(reversed(items)) if order == "desc" else list(items)
    start = 0
    if after is not None:
        # The first item carrying the id, in input order (duplicates are the client's doing).
        index = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if index is None:
            return list_page([], False)
        start = len(items) - index if order == "desc" else index + 1
    chunk = ordered[start : start + limit + 1]
    return list_page(chunk[:limit], len(chunk) > limit)
