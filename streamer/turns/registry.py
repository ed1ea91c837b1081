"""Which upstream serves a request: the router over the configured models and replicas.

The gateway asks the registry which model a request names (`plan`, before the turn is
prepared: the model's turn options shape it), binds the prepared turn to it (`bind`: its
affinity key), and per turn for the upstream that runs it (`resolve`: a `TurnRoute` that
waits for the model's slot, picks the replica and fails over). It goes through it for what
is not a turn (`/v1/models`, the `/readyz` probe, shutdown). Frontends never hold an upstream.
"""

from __future__ import annotations

from typing import Any, Protocol

from streamer.core.batch import Upstream
from streamer.core.models_config import ModelsConfig, single
from streamer.turns.options import ModelOptions
from streamer.turns.router import Plan, Router, TurnRoute
from streamer.turns.turn import Turn


class Backend(Upstream, Protocol):
    """An upstream as the gateway uses it: turns (`open`), plus models, probe and close."""

    async def get_models(self, *, headers: dict[str, str] | None = None) -> tuple[int, bytes]: ...
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


class UpstreamRegistry:
    """The upstreams this gateway may send to, and the rule that picks one."""

    __slots__ = ("router",)

    def __init__(self, router: Router | Backend) -> None:
        if not isinstance(router, Router):  # one backend: a config of one model on it
            backend = router
            router = Router(
                single("backend", api_key=None, model=None),
                lambda spec, url, options: backend,
                lambda spec: ModelOptions(),
                queue_seconds=0,
                health_interval=0,
                affinity_entries=0,
            )
        self.router = router

    @property
    def default(self) -> Any:
        """The first model's first replica's client (one backend: the backend)."""
        backend = self.router.table.order[0].replicas[0].backend
        return getattr(backend, "inner", backend)

    @property
    def config(self) -> ModelsConfig:
        return self.router.table.config

    def plan(self, body: Any) -> Plan:
        """The model `body` names in the current config (404 `model_not_found` for another)."""
        table = self.router.table
        model = (
            body.get("model") if isinstance(body, dict) else 0
        )  # not an object: validation says so
        return Plan(table, table.route_for(model), None)

    def bind(
        self, turn: Turn, plan: Plan, session: str | None, *, inherited: str | None = None
    ) -> None:
        """The prepared turn goes by `plan`; its response names the model (not an alias).
        `inherited`: the affinity key the continued response was stored with (any instance
        may have made it), which the chain keeps."""
        route = plan.route
        if len(route.replicas) > 1 or route.spec.fallbacks:
            chains = self.router.chains
            plan.key = chains.key_for(turn.response["id"], turn.request, session, inherited)
        if route.spec.name is not None:
            turn.response["model"] = route.spec.name
        turn.route = plan

    def resolve(self, turn: Turn | None = None) -> Any:
        """The upstream that serves `turn` (no turn: the first model's first replica)."""
        if turn is None:
            return self.router.table.order[0].replicas[0].backend
        plan = turn.route
        if not isinstance(plan, Plan):  # a turn prepared without the gateway (tests)
            plan = self.plan(turn.request)
        return TurnRoute(self.router, plan, turn)

    def replica(self, turn: Turn) -> Any:
        """A backend of `turn`'s model for what is not a turn (its tokenizer): the model's
        first replica (replicas of one model share a tokenizer)."""
        plan = self._plan_of(turn)
        return plan.route.replicas[0].backend if plan.route.replicas else self.default

    def options(self, turn: Turn) -> ModelOptions:
        """The options of `turn`'s model (its profile names its tokenizer)."""
        return self._plan_of(turn).route.options

    def _plan_of(self, turn: Turn) -> Plan:
        return turn.route if isinstance(turn.route, Plan) else self.plan(turn.request)

    def chat(self) -> Any:
        """The single-backend flags' client (the profile probe reads its models)."""
        return self.default

    async def models(self, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """`GET /v1/models` as the first model's first replica answers it: status and body."""
        return await self.router.table.order[0].replicas[0].backend.get_models(headers=headers)

    async def ping(self) -> bool:
        """Whether every model has a replica that answers (readiness)."""
        for route in self.router.table.order:
            if not any([await replica.backend.ping() for replica in route.replicas]):
                return False
        return True

    async def close(self) -> None:
        await self.router.close()
