"""Store operations as operators see them: one count per operation and outcome, and a
span each (`span`: the app passes streamer/tracing.py's, which makes one only inside a
trace and none when tracing is off).

`observe_store` instruments a store in place (its public coroutines are replaced on the
instance), so the object keeps its class: code and tests that ask `isinstance(store,
MemoryStore)` still get the answer they expect. Outcomes: `ok`, `miss` (an unknown
response id: None or False back) and `error` (it raised, e.g. `StoreUnavailable`, or a
ping said no).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

S = TypeVar("S")

_COUNTED = (
    "put",
    "get",
    "get_response",
    "get_item",
    "delete",
    "input_items",
    "append_event",
    "end_events",
    "request_cancel",
    "ping",
    "shared_secret",
    "last_seq",
    "hold_lease",
    "lease_alive",
    "release_lease",
    "lapsed_leases",
)
_LOOKUPS = frozenset({"get", "get_response", "get_item", "delete", "input_items"})


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


class SpanFactory(Protocol):
    """`tracing.span`'s shape: a context manager over one operation."""

    def __call__(
        self, name: str, attributes: dict[str, str], kind: str, *, nested: bool
    ) -> contextlib.AbstractContextManager[object]: ...


def no_span(
    name: str, attributes: dict[str, str], kind: str, *, nested: bool
) -> contextlib.AbstractContextManager[object]:
    return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


def observe_store(
    store: S,
    counter: _Labelled,
    incomplete: _Labelled | None = None,
    span: SpanFactory = no_span,
) -> S:
    """Count every call of `store`'s operations in `counter` (labels: operation, outcome),
    and what it finds incomplete in `incomplete` (label: what, `record` or `events`); each
    call inside `span(f"store {operation}", ...)`."""
    if incomplete is not None and hasattr(store, "on_incomplete"):
        store.on_incomplete = lambda what: incomplete.labels(what).inc()
    system = type(store).__name__.removesuffix("Store").lower()  # memory, redis, sqlite
    for name in _COUNTED:
        method = getattr(store, name, None)
        if method is not None:
            setattr(store, name, _counted(name, method, counter, system, span))
    events = getattr(store, "events", None)
    if events is not None:
        setattr(store, "events", _counted_events(events, counter))  # noqa: B010
    return store


def _counted(
    name: str,
    method: Callable[..., Awaitable[Any]],
    counter: _Labelled,
    system: str = "",
    span: SpanFactory = no_span,
) -> Callable[..., Awaitable[Any]]:
    span_name = f"store {name}"
    attributes = {"db.operation.name": name, "db.system.name": system or "store"}

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with span(span_name, attributes, "client", nested=True):
                result = await method(*args, **kwargs)
        except Exception:
            counter.labels(name, "error").inc()
            raise
        if result is False and name == "ping":
            outcome = "error"
        elif name in _LOOKUPS and not result and result != {}:
            outcome = "miss"  # None (unknown id), or False from delete
        else:
            outcome = "ok"
        counter.labels(name, outcome).inc()
        return result

    return call


def _counted_events(
    method: Callable[..., AsyncIterator[Any]], counter: _Labelled
) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(method)
    async def events(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        outcome = "ok"
        try:
            inner = method(*args, **kwargs)
            closing: contextlib.AbstractAsyncContextManager[object] = (
                contextlib.aclosing(inner)
                if isinstance(inner, AsyncGenerator)
                else contextlib.nullcontext()
            )
            async with closing:
                async for item in inner:
                    yield item
        except Exception:
            outcome = "error"
            raise
        finally:
            counter.labels("events", outcome).inc()

    return events
