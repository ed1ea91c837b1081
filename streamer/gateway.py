"""The gateway: per-process state (settings, upstreams, store) and every turn's lifecycle.

It turns a client's body into a prepared `Turn` (continuing a stored response when the
body names `previous_response_id`), runs it into a transport's `Sink` (observed, stored
at its end), drains turns at shutdown and starts background turns. It knows no HTTP:
the frontends (SSE, JSON, WebSocket, background) are transports over `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from streamer import conversations
from streamer.config import Settings
from streamer.core import item_references
from streamer.core.errors import RequestError, invalid, shutting_down
from streamer.core.events import Event
from streamer.core.replayed_json import ReplayedBodies
from streamer.identity import request_client
from streamer.metrics import Metrics
from streamer.observe import Observation, open_recording
from streamer.options import turn_options
from streamer.pipeline import Sink, Turn, TurnEvents, TurnOptions, prepare
from streamer.quiet_trim import QuietTrim, malloc_trim
from streamer.recorder import TapDirectory
from streamer.records import stored
from streamer.store import ResponseStore, StoreUnavailable
from streamer.upstream.registry import UpstreamRegistry

if TYPE_CHECKING:
    from streamer.frontends.background import Background

log = logging.getLogger("streamer.gateway")

SHUT_DOWN = "The gateway shut down before the response finished; retry the request."


def previous_not_found(response_id: str) -> RequestError:
    return invalid(
        f"Previous response with id '{response_id}' not found.",
        "previous_response_id",
        "previous_response_not_found",
    )


def continuation(
    input_items: Sequence[Mapping[str, Any]], output: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The history a continuation starts from: the previous input, then its output."""
    return [*map(dict, input_items), *map(dict, output)]


def store_unavailable(exc: StoreUnavailable) -> RequestError:
    """A store outage as the client sees it: a 503, never a hang."""
    return RequestError(
        f"The response store is unavailable: {exc}",
        status=503,
        type="server_error",
        code="store_unavailable",
    )


def always(turn: Turn) -> bool:
    """Store every finished turn (HTTP: failed ones too)."""
    return True


def never(turn: Turn) -> bool:
    """Store nothing at the end (background turns write their record as they go)."""
    return False


class InFlight:
    """The drained turns being served, so that a shutdown lets them finish, then ends the rest.

    At the deadline each remaining turn's task is cancelled with `cut` set: `Gateway.run`
    then ends it as `response.failed`, stored as such, instead of being torn off mid-frame.
    """

    __slots__ = ("closing", "cut", "tasks")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False  # shutting down: no new turns
        self.cut = False  # the deadline passed: a cancelled turn ends as failed

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """The current task is a turn the shutdown drains while inside."""
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            yield
        finally:
            self.tasks.discard(task)

    async def drain(self, deadline: float) -> None:
        """Let the turns run until `deadline` (loop time), then end the rest as failed."""
        self.closing = True
        loop = asyncio.get_running_loop()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=max(0.0, deadline - loop.time()))
        if self.tasks:
            self.cut = True
            for task in self.tasks:
                task.cancel()
            await asyncio.wait(list(self.tasks), timeout=1.0)  # each only writes its end

    def absorb_cut(self) -> bool:
        """In a cancelled turn: whether the deadline cancelled it (the cancel is then undone)."""
        task = asyncio.current_task()
        if not self.cut or task not in self.tasks:  # another cancel (a WebSocket closing, …)
            return False
        assert task is not None
        task.uncancel()
        return True


class Gateway:
    """Settings, upstreams, store and background turns; owns every turn's lifecycle."""

    def __init__(
        self,
        settings: Settings,
        upstreams: UpstreamRegistry,
        store: ResponseStore,
        background: Background,
        *,
        options: TurnOptions | None = None,
    ) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.store = store
        self.background = background
        self.options = options or turn_options(settings)
        # long request bodies, for the next one that replays one (core/replayed_json.py):
        # a quarter of --history-cache-bytes
        cache = settings.history_cache_bytes
        self.bodies = ReplayedBodies(cache // 4) if cache > 0 else None
        self.in_flight = InFlight()
        self.conversations = conversations.Conversations(store, settings.max_input_items)
        self.stats: dict[str, int] = {"http_turns": 0, "ws_connections": 0, "ws_turns": 0}
        self.metrics = Metrics()
        self.tap = TapDirectory(settings.tap_dir) if settings.tap_dir else None
        self.quiet = QuietTrim(
            settings.trim_after, malloc_trim() if settings.trim_after > 0 else None
        )

    def client(self, authenticated: str | None, headers: Mapping[str, str]) -> str:
        """The identity a request acts as (its matched key, or the forwarded Authorization):
        it owns what it stores, sees only that."""
        return request_client(
            authenticated, headers, forward_authorization=self.settings.forward_authorization
        )

    async def prepare(
        self,
        body: Any,
        *,
        client: str | None = None,
        authorization: str | None = None,
        history: Sequence[dict[str, Any]] | None = None,
        session: str | None = None,
    ) -> Turn:
        """Validate, continue from the store if asked, and lower one request.

        `client`: who asks (`Gateway.client`); `authorization`: the client's header, forwarded to
        the backend under `--forward-authorization`; `history`: given by a transport that
        holds it (a WebSocket's remembered responses), else loaded from the store; `session`:
        the WebSocket connection's id (its turns keep to one replica).
        """
        plan = self.upstreams.plan(body)  # the model named: 404 for one the config lacks
        base = None
        if history is None:
            previous = body.get("previous_response_id") if isinstance(body, dict) else None
            # absent, or a type error that validation reports with its param
            history = []
            if isinstance(previous, str):
                history, base = await self.continued_history(previous, client)
        conversation = None
        if isinstance(body, dict) and body.get("conversation") is not None:
            conversation, body, history = await self.conversation(body, history, client)
        if isinstance(body, dict) and item_references.referenced_ids(body.get("input")):
            body = {**body, "input": await self.references(body["input"], history, client)}
        turn = prepare(body, plan.route.options.turn, history=history, client=client or "")
        self.upstreams.bind(turn, plan, session)
        turn.conversation, turn.new_from, turn.stored_base = conversation, len(history), base
        if authorization and self.settings.forward_authorization:
            turn.headers["Authorization"] = authorization
        return turn

    async def continued_history(
        self, previous: str, client: str | None
    ) -> tuple[Sequence[dict[str, Any]], tuple[str, int] | None]:
        """`history`; for a response this process stored with a kept turn, its input comes
        from there (`HistoryCache.stored_input`) and the store is asked only for the
        response (is it still there, for this client; its output): with the record's base,
        `(previous, how many items are its input)` (`Turn.stored_base`), else None."""
        cache = self.options.history
        stored = cache.stored_input(previous, client) if cache is not None else None
        if cache is None or stored is None:
            return await self.history(previous, client), None
        try:
            response = await self.store.get_response(previous, owner=client)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None
        if response is None:
            raise previous_not_found(previous)
        output = [*map(dict, response.get("output") or [])]
        return cache.continuation(previous, stored, output), (previous, len(stored))

    def continuation(self, turn: Turn) -> tuple[dict[str, Any], ...]:
        """`(*turn.items, *output)`: what a continuation of the turn starts from (a
        WebSocket's remembered response), marked on the kept turn as made from it."""
        output = turn.response.get("output") or []
        cache = self.options.history
        if cache is None:
            return (*turn.items, *output)
        return cache.continuation(turn.response["id"], turn.items, output)

    async def history(self, previous: str, client: str | None) -> list[dict[str, Any]]:
        """The continued response's input then output; another client's is not found, and
        a store outage is a 503."""
        if not previous:
            return []
        if conversations.is_conversation_id(previous):  # a conversation is no response
            raise previous_not_found(previous)
        try:
            record = await self.store.get(previous, owner=client)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None
        if record is None:
            raise previous_not_found(previous)
        return continuation(record.input_items, record.response.get("output") or [])

    async def conversation(
        self, body: dict[str, Any], history: Sequence[dict[str, Any]], client: str | None
    ) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        """`conversation` on create: its id, the body echoing `{"id": …}`, and the history
        with the conversation's items (404 for an unknown or another client's one)."""
        conversation_id = conversations.requested_id(body["conversation"])
        assert conversation_id is not None
        record = await self.conversations.get(conversation_id, client)
        if record is None:
            raise conversations.not_found(conversation_id, "conversation")
        body = {**body, "conversation": {"id": conversation_id}}
        return conversation_id, body, [*history, *record.input_items]

    async def references(
        self, value: list[Any], history: Sequence[dict[str, Any]], client: str | None
    ) -> list[Any]:
        """`input` with its item_references replaced by the items: from the continued
        history, else the store (only this client's records); unknown ids are a 400."""
        wanted = item_references.referenced_ids(value)
        if len(wanted) > self.options.max_input_items:
            raise invalid(f"Too many item references: {len(wanted)}.", "input")
        found = item_references.items_by_id(history)
        for item_id in wanted:
            if item_id in found:
                continue
            try:
                item = await self.store.get_item(item_id, owner=client)
            except StoreUnavailable as exc:
                raise store_unavailable(exc) from None
            if item is not None:
                found[item_id] = item
        return item_references.resolve(value, found)

    async def run(
        self, turn: Turn, sink: Sink, transport: str, *, keep: Callable[[Turn], bool] = always
    ) -> None:
        """Run one turn into `sink`, observed (metrics, `--tap-dir`), stored at its end.

        A finished turn is stored (if `keep(turn)`, and unless `store: false`) before its
        last batch goes out, so a client can chain from it at once. A refusal before the
        first event raises `RequestError` with nothing sent. At the shutdown deadline a
        drained turn ends `failed`, stored, if its client was answered; else a 503.
        """
        streamer = turn.streamer
        ending: list[Event] = []  # the last batch, while it is being stored and not yet sent
        seen = Observation(turn, transport, self.metrics, self.quiet, self.tap)
        events = TurnEvents(
            turn, self.upstreams.resolve(turn), on_raw=seen.on_raw, on_request=seen.on_request
        )
        try:
            try:
                await events.open()
            except RequestError as exc:
                seen.refused(exc)
                raise
            while (batch := await events.next()) is not None:
                seen.sent(batch)
                if not streamer.done:
                    await sink.send(batch, False)
                    del batch  # sent: not kept while the next batch is awaited
                    continue
                ending = batch
                if keep(turn):
                    await self.remember(turn)
                if turn.conversation is not None:
                    await self.extend_conversation(turn)
                ending = []
                await sink.send(batch, True)
                return
        except asyncio.CancelledError:
            if not self.in_flight.absorb_cut():
                raise
            await events.close()
            await self._cut(turn, sink, ending, keep)
        finally:
            await events.close()
            seen.close()

    async def _cut(
        self, turn: Turn, sink: Sink, ending: list[Event], keep: Callable[[Turn], bool]
    ) -> None:
        """The shutdown deadline: end the turn well. A send that was interrupted has
        already handed its bytes over, so only an unsent end remains."""
        if not sink.answered:
            raise shutting_down() from None
        tail = ending or turn.streamer.fail("server_error", SHUT_DOWN)
        if tail:
            if keep(turn):
                await self.remember(turn)
            await sink.send(tail, True)

    async def remember(self, turn: Turn) -> None:
        """Store a finished response unless the client said `store: false`."""
        if turn.request.get("store") is False:
            return
        record = stored(turn)
        try:
            await self.store.put(record)
        except Exception as exc:  # the client already has its answer; say so in the log
            log.warning("could not store response %s: %s", turn.response["id"], exc)
            return
        if self.options.history is not None:  # its continuation need not read it back
            self.options.history.recorded(record.id, record.owner, record.input_items)

    async def extend_conversation(self, turn: Turn) -> None:
        """A finished turn on a conversation: its input and output join it."""
        assert turn.conversation is not None
        if turn.response["status"] not in ("completed", "incomplete"):
            return
        await self.conversations.after_turn(
            turn.conversation,
            turn.client,
            turn.items[turn.new_from :],
            turn.response.get("output") or [],
        )

    async def models(self, authorization: str | None) -> tuple[int, bytes]:
        """`GET /v1/models` from the backend: status and body (the client's Authorization
        forwarded under `--forward-authorization`)."""
        headers = None
        if authorization and self.settings.forward_authorization:
            headers = {"Authorization": authorization}
        return await self.upstreams.models(headers)

    async def start_background(self, turn: Turn) -> bytes:
        """Accept a background turn (stored as queued, then run in its own task); its
        queued snapshot. Its `--tap-dir` recording is opened here and kept by the background
        turn: it holds every event of the log, `response.queued` and a cancel included."""
        if self.tap is not None:
            turn.recorder = open_recording(self.tap, turn)
        return await self.background.start(turn, self._run_background)

    async def _run_background(self, turn: Turn, sink: Sink) -> None:
        await self.run(turn, sink, "background", keep=never)  # it writes its own record

    async def close(self) -> None:
        """Shutdown: background turns end, then the upstreams and the store close."""
        self.quiet.close()
        await self.background.close()
        await self.upstreams.close()
        await self.store.close()
