"""The routing shell: replicas, per-model concurrency, failover and reload over `core.routing`.

A `RouteTable` is one config's models (each with its replicas, its turn options and its
concurrency limit). A turn is bound to the table it was prepared on (`Plan`): a reload
(`Router.reload`) swaps the table for new turns while turns in flight finish on theirs.
Replicas with the same URL and key are the same object across tables (health, in-flight
counts and pooled connections carry over); one a reload drops is closed once idle.

`TurnRoute.open` is what the pipeline calls: it waits for a slot of the model (up to
`--route-queue-seconds`, then 429 with `retry-after`), tries the replicas in `rank` order,
then each fallback that has what the turn needs; a connect error, a 5xx or a 429 before the
first byte moves on (logged), anything else is the turn's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamer import tracing
from streamer.core import routing
from streamer.core.batch import UpstreamStream
from streamer.core.errors import RequestError
from streamer.core.models_config import ModelsConfig, ModelSpec
from streamer.turns.genai_spans import backend_attributes, replica_name
from streamer.turns.options import ModelOptions
from streamer.turns.turn import Turn

if TYPE_CHECKING:
    from streamer.metrics import Metrics

log = logging.getLogger("streamer.routing")


class Replica:
    """One upstream URL of a model: its client and what routing knows of it."""

    __slots__ = ("backend", "name", "retired", "state")

    def __init__(self, url: str, backend: Any) -> None:
        self.state = routing.ReplicaState(url)
        self.backend = backend
        self.name = replica_name(url)  # in logs, metrics and spans: no credentials
        self.retired = False  # dropped by a reload: closed once nothing runs on it

    async def release(self) -> None:
        self.state.in_flight -= 1
        if self.retired and self.state.in_flight == 0:
            await self.backend.close()


class Limit:
    """At most `size` turns of a model at once (0: any); others wait, first come first."""

    __slots__ = ("size", "used", "waiters")

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        if self.size and (self.used >= self.size or self.waiters):
            return False
        self.used += 1
        return True

    async def acquire(self, wait: float) -> bool:
        if self.try_acquire():
            return True
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait)
            return True
        except BaseException as exc:  # past the wait, or cancelled (the client went away)
            if waiter.done():  # handed a slot as it gave up: pass it on
                self.release()
            if isinstance(exc, TimeoutError):
                return False
            raise
        finally:
            with contextlib.suppress(ValueError):
                self.waiters.remove(waiter)

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it: `used` stays
                return
        self.used -= 1


@dataclass(slots=True)
class ModelRoute:
    spec: ModelSpec
    replicas: list[Replica]
    options: ModelOptions
    limit: Limit
    turns: int = 0


class RouteTable:
    """One config's models, by name."""

    def __init__(self, config: ModelsConfig, routes: list[ModelRoute]) -> None:
        self.config = config
        self.routes = {route.spec.label: route for route in routes}
        self.order = routes

    def route_for(self, model: Any) -> ModelRoute:
        """The model a request names (or the default); 404 `model_not_found` for another."""
        config = self.config
        if model is not None and not isinstance(model, str):
            return self.order[0]  # the request's validation names the wrong type
        name = model or config.default_model
        if name is None:
            if config.source is None:
                return self.order[0]
            raise RequestError(
                "Missing required parameter: 'model'.",
                param="model",
                code="missing_required_parameter",
            )
        spec = config.find(name)
        if spec is None:
            raise RequestError(
                f"The model '{name}' does not exist or you do not have access to it.",
                status=404,
                param="model",
                code="model_not_found",
            )
        return self.routes[spec.label]

    def replicas(self) -> Iterator[Replica]:
        for route in self.order:
            yield from route.replicas


@dataclass(slots=True)
class Plan:
    """A turn's route: the table it was prepared on, its model, its affinity key."""

    table: RouteTable
    route: ModelRoute
    key: str | None


class Router:
    """The current table, the chains' affinity keys, active health checks."""

    def __init__(
        self,
        config: ModelsConfig,
        build: Callable[[ModelSpec, str, ModelOptions], Any],
        options: Callable[[ModelSpec], ModelOptions],
        *,
        queue_seconds: float,
        health_interval: float,
        affinity_entries: int,
    ) -> None:
        self.build, self.options = build, options
        self.queue_seconds = queue_seconds
        self.health_interval = health_interval
        # a replica that failed a turn is tried last for this long (or until a good probe)
        self.cooldown = health_interval if health_interval > 0 else 10.0
        self.chains = routing.Chains(affinity_entries)
        self.table = self._table(config, {})
        self._health: asyncio.Task[None] | None = None
        self.metrics: Metrics | None = None  # the gateway's: queue waits, 429s, detours

    def _table(self, config: ModelsConfig, known: dict[Hashable, Replica]) -> RouteTable:
        routes = []
        for spec in config.models:
            options = self.options(spec)
            replicas = []
            for url in spec.upstreams:
                replica = known.get(_identity(spec, url))
                if replica is None:
                    backend = self.build(spec, url, options)
                    replica = known[_identity(spec, url)] = Replica(url, backend)
                replicas.append(replica)
            limit = Limit(spec.max_concurrency)
            routes.append(ModelRoute(spec, replicas, options, limit))
        return RouteTable(config, routes)

    def _known(self) -> dict[Hashable, Replica]:
        return {
            _identity(route.spec, r.state.url): r
            for route in self.table.order
            for r in route.replicas
        }

    async def reload(self, config: ModelsConfig) -> None:
        """New turns use `config`; turns in flight finish on the table they started on."""
        known = self._known()
        old = set(map(id, known.values()))
        table = self._table(config, dict(known))
        for route in table.order:  # limits carry over for a model kept, with its new size
            previous = self.table.routes.get(route.spec.label)
            if previous is not None:
                route.limit = previous.limit
                route.limit.size = route.spec.max_concurrency
        kept = {id(r) for r in table.replicas()}
        self.table = table
        for replica in known.values():
            if id(replica) in old and id(replica) not in kept:
                replica.retired = True
                if replica.state.in_flight == 0:
                    await replica.backend.close()
        log.warning("config reloaded from %s: %d models", config.source, len(config.models))

    def start(self) -> None:
        if self.health_interval > 0 and self.table.config.source is not None:
            self._health = asyncio.get_running_loop().create_task(self._check_health())

    async def _check_health(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            for replica in list(self.table.replicas()):
                ok = False
                with contextlib.suppress(Exception):
                    ok = await replica.backend.ping()
                if ok:
                    if not replica.state.healthy:
                        log.warning("replica %s passed its health check", replica.state.url)
                    routing.mark_ok(replica.state)
                    continue
                if replica.state.healthy:
                    log.warning("replica %s failed its health check", replica.state.url)
                # down until the check after next: no gap between two failed checks
                routing.mark_failed(replica.state, _now(), 2 * self.health_interval)

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        for replica in self.table.replicas():
            await replica.backend.close()


def _identity(spec: ModelSpec, url: str) -> Hashable:
    """What makes two replicas one client: kept across a reload (health, pools) when equal."""
    return (url, spec.api_key, spec.profile, spec.api, spec.settings)


def _now() -> float:
    return asyncio.get_running_loop().time()


class RoutedStream:
    """The opened stream, giving back the replica and the model's slot when closed."""

    __slots__ = ("_release", "first", "inner", "span")

    def __init__(
        self, inner: UpstreamStream, release: Callable[[], Awaitable[None]], span: Any = None
    ) -> None:
        self.inner, self.first = inner, inner.first
        self._release: Callable[[], Awaitable[None]] | None = release
        self.span = span  # the backend attempt's span (tracing on), ended with the stream

    def __aiter__(self) -> Any:
        return self.inner.__aiter__()  # the per-batch path stays the inner stream's

    async def aclose(self) -> None:
        release, self._release = self._release, None
        span, self.span = self.span, None
        try:
            await self.inner.aclose()
        finally:
            if span is not None:  # tracing on
                tracing.end(span)
            if release is not None:
                await release()


class TurnRoute:
    """The upstream of one turn (what `UpstreamRegistry.resolve` gives the pipeline)."""

    __slots__ = ("plan", "router", "turn")

    def __init__(self, router: Router, plan: Plan, turn: Turn) -> None:
        self.router, self.plan, self.turn = router, plan, turn

    async def open(self, backend_request: dict[str, Any], **kwargs: Any) -> UpstreamStream:
        route, metrics = self.plan.route, self.router.metrics
        started = _now() if route.limit.size else 0.0
        acquired = await route.limit.acquire(self.router.queue_seconds)
        if metrics is not None and route.limit.size:
            metrics.child(metrics.queue_wait, route.spec.label).observe(_now() - started)
        if not acquired:
            log.warning("turn %s: %s at its concurrency limit: 429", self._id, route.spec.label)
            if metrics is not None:
                metrics.child(metrics.rate_limited, route.spec.label, "gateway").inc()
            raise _busy(route.spec, self.router.queue_seconds)
        try:
            return await self._try(route, backend_request, kwargs)
        except BaseException:
            route.limit.release()
            raise

    async def _try(
        self, first: ModelRoute, backend_request: dict[str, Any], kwargs: Any
    ) -> UpstreamStream:
        """The first model's replicas, then each fallback that has what the turn needs."""
        last: RequestError | None = None
        for route in self._candidates(first, backend_request):
            fallback = route is not first
            if fallback and not route.limit.try_acquire():
                log.warning(
                    "turn %s: fallback %s skipped: at its limit", self._id, route.spec.label
                )
                continue
            try:
                request = self._relowered(route) if fallback else backend_request
                stream, replica, span = await self._replicas(route, request, kwargs)
            except RequestError as exc:
                if fallback:
                    route.limit.release()
                if not routing.retryable(exc.status):
                    raise
                last = exc
                continue
            if fallback:  # the fallback's slot is held now, not the first model's
                first.limit.release()
                self.turn.response["model"] = route.spec.label
                log.warning("turn %s: served by fallback %s", self._id, route.spec.label)
                self._count("fallbacks", first.spec.label, route.spec.label)
            return RoutedStream(stream, _releaser(route, replica), span)
        assert last is not None
        raise last

    @property
    def _id(self) -> str:
        return str(self.turn.response.get("id"))

    def _candidates(
        self, first: ModelRoute, backend_request: dict[str, Any]
    ) -> Iterator[ModelRoute]:
        """The first model, then (once it failed) each fallback with what the turn needs."""
        yield first
        needs = routing.needs(self.turn.request, backend_request)
        table = self.plan.table
        for name in first.spec.fallbacks:
            route = table.routes[table.config.named(name).label]
            spec = route.spec
            lacks = needs.missing(
                spec.supports_tools, spec.supports_images, spec.supports_reasoning
            )
            if lacks:
                log.warning(
                    "turn %s: fallback %s skipped: it has no %s",
                    self._id,
                    spec.label,
                    ", ".join(lacks),
                )
                continue
            yield route

    def _relowered(self, route: ModelRoute) -> dict[str, Any]:
        """The request for a fallback model: lowered by its own kind (Chat Completions, a
        Responses request, ...), with its profile and model name; a compaction turn by its
        kind's compaction lowering."""
        options, turn = route.options.turn, self.turn
        kind = options.kind
        lowered = kind.compaction if turn.compactor is not None else kind.lower
        return lowered(turn.request, turn.view or turn.items, turn.names, options.lowering)

    async def _replicas(
        self, route: ModelRoute, request: dict[str, Any], kwargs: Any
    ) -> tuple[UpstreamStream, Replica, Any]:
        """Each replica in rank order until one answers; else the last retryable error.
        Each attempt is a span (tracing on), its `traceparent` sent to the backend."""
        replicas = route.replicas
        route.turns += 1
        if len(replicas) == 1:
            order = [0]
        else:
            order = routing.rank([r.state for r in replicas], self.plan.key, _now(), route.turns)
        alone = len(replicas) == 1 and not route.spec.fallbacks
        last: RequestError | None = None
        for index in order:
            replica = replicas[index]
            replica.state.in_flight += 1
            self.turn.replica = replica.name  # the last one tried: a refusal names it
            span = self._attempt(route, replica, request) if tracing.enabled() else None
            try:
                if span is None:
                    stream = await replica.backend.open(request, **kwargs)
                else:
                    headers = tracing.headers_for(span, kwargs.get("headers"))
                    stream = await replica.backend.open(request, **{**kwargs, "headers": headers})
            except RequestError as exc:
                tracing.end(span, {"http.response.status_code": exc.status}, exc.code or "error")
                await replica.release()
                if exc.status == 429:
                    self._count("rate_limited", route.spec.label, "backend")
                if alone or not routing.retryable(exc.status):
                    raise
                self._count("failovers", route.spec.label, replica.name)
                routing.mark_failed(replica.state, _now(), self.router.cooldown)
                log.warning(
                    "turn %s: %s replica %s failed before the first byte (%s %s); moving on",
                    self._id,
                    route.spec.label,
                    replica.state.url,
                    exc.status,
                    exc.code,
                )
                last = exc
                continue
            except BaseException as exc:
                tracing.end(span, None, type(exc).__qualname__)
                await replica.release()
                raise
            if not replica.state.healthy:
                routing.mark_ok(replica.state)
            return stream, replica, span
        assert last is not None
        raise last

    def _count(self, counter: str, *labels: str) -> None:
        metrics = self.router.metrics
        if metrics is not None:
            metrics.child(getattr(metrics, counter), *labels).inc()

    @staticmethod
    def _attempt(route: ModelRoute, replica: Replica, request: dict[str, Any]) -> Any:
        """The span of one backend attempt (kind CLIENT, `chat {model as sent}`)."""
        api = route.options.turn.kind.name
        attributes = backend_attributes(route.spec.label, replica.state.url, request, api)
        attributes["streamer.replica"] = replica.name
        return tracing.start(f"chat {attributes['gen_ai.request.model']}", attributes, "client")


def _releaser(route: ModelRoute, replica: Replica) -> Callable[[], Awaitable[None]]:
    async def release() -> None:
        route.limit.release()
        await replica.release()

    return release


def _busy(spec: ModelSpec, waited: float) -> RequestError:
    retry = max(1, math.ceil(waited))
    return RequestError(
        f"The model '{spec.label}' is at its concurrency limit ({spec.max_concurrency} at "
        f"once); retry after {retry} s.",
        status=429,
        type="requests",
        code="rate_limit_exceeded",
        headers={"retry-after": str(retry)},
    )
