"""The gateway: per-process state (settings, upstreams, store) and every turn's lifecycle.

It turns a client's body into a prepared `Turn` (continuing a stored response when the
body names `previous_response_id`), runs it into a transport's `Sink` (observed, stored
at its end) and starts background turns. `run` is the one place a turn ends, however it
ends; every turn it runs is in the one in-flight registry (`in_flight`, streamer/turns/in_flight.py),
which the shutdown drains once. It knows no HTTP: the frontends (SSE, JSON, WebSocket,
background) are transports over `run`, moving its events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from streamer.config import Settings
from streamer.core import item_references
from streamer.core.errors import (
    STORE_UNAVAILABLE,
    RequestError,
    invalid,
    shutting_down,
    store_unavailable,
)
from streamer.core.events import Event
from streamer.core.identity import request_client
from streamer.core.replayed_json import ReplayedBodies
from streamer.mcp.client import McpClients
from streamer.metrics import Metrics
from streamer.store import ResponseStore, StoredResponse, StoreUnavailable
from streamer.store.health import StoreHealth
from streamer.turns import conversations
from streamer.turns.in_flight import InFlight, Stop
from streamer.turns.observe import Observation, open_recording
from streamer.turns.options import mcp_settings, turn_options
from streamer.turns.quiet_trim import QuietTrim, malloc_trim
from streamer.turns.recorder import TapDirectory
from streamer.turns.records import stored, unstored
from streamer.turns.registry import UpstreamRegistry
from streamer.turns.turn import Turn, TurnOptions, prepare, warmup
from streamer.turns.turn_runner import BROKEN, Sink, TurnEvents


class Background(Protocol):
    """What the gateway needs of its background turns (frontends/background.py's
    `Background`): start one, run by `run`; cancel one; close them all at shutdown."""

    async def start(
        self, turn: Turn, run: Callable[[Turn, Sink], Awaitable[None]], in_flight: InFlight
    ) -> bytes: ...
    async def cancel(self, response_id: str) -> dict[str, Any] | None: ...
    async def close(self) -> None: ...


log = logging.getLogger("streamer.gateway")

SHUT_DOWN = "The gateway shut down before the response finished; retry the request."
STORE_FAILED = "The response store was unavailable."


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


def always(turn: Turn) -> bool:
    """Store every finished turn (HTTP: failed ones too)."""
    return True


def never(turn: Turn) -> bool:
    """Store nothing at the end (background turns write their record as they go)."""
    return False


def _history_of(record: StoredResponse | None) -> list[dict[str, Any]]:
    if record is None:
        return []
    return continuation(record.input_items, record.response.get("output") or [])


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
        # --readyz-cache-seconds: how often a store known to be down is asked again
        self.store_health = StoreHealth(store, settings.readyz_cache_seconds)
        self.conversations = conversations.Conversations(store, settings.max_input_items)
        self.stats: dict[str, int] = {"http_turns": 0, "ws_connections": 0, "ws_turns": 0}
        self.metrics = Metrics()
        self.metrics.per_client = bool(settings.client_keys())  # a bounded set of clients
        self.tap = TapDirectory(settings.tap_dir) if settings.tap_dir else None
        self.mcp = McpClients(mcp_settings(settings))  # remote MCP servers' tool lists
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
        affinity = base = None
        if history is None:
            previous = body.get("previous_response_id") if isinstance(body, dict) else None
            # absent, or a type error that validation reports with its param
            history = []
            if isinstance(previous, str):
                history, base, affinity = await self.continued_history(previous, client)
        conversation = None
        if isinstance(body, dict) and body.get("conversation") is not None:
            conversation, body, history = await self.conversation(body, history, client)
        if isinstance(body, dict) and item_references.referenced_ids(body.get("input")):
            body = {**body, "input": await self.references(body["input"], history, client)}
        turn = prepare(body, plan.route.options.turn, history=history, client=client or "")
        await self.check_store(turn.request)  # valid: a store outage is no reason for a 400
        self.upstreams.bind(turn, plan, session, inherited=affinity)
        turn.conversation, turn.new_from, turn.stored_base = conversation, len(history), base
        turn.mcp_clients = self.mcp
        if authorization and self.settings.forward_authorization:
            turn.headers["Authorization"] = authorization
        return turn

    async def continued_history(
        self, previous: str, client: str | None
    ) -> tuple[Sequence[dict[str, Any]], tuple[str, int] | None, str | None]:
        """`history`, the record's base and its affinity key. For a response this process
        stored with a kept turn, its input comes from there (`HistoryCache.stored_input`)
        and the store is asked only for the response (is it still there, for this client;
        its output); the base is `(previous, how many items are its input)`
        (`Turn.stored_base`), else None."""
        cache = self.options.history
        kept = cache.stored_input(previous, client) if cache is not None else None
        if cache is None or kept is None:
            record = await self.continued(previous, client)
            return _history_of(record), None, record.affinity if record is not None else None
        stored, affinity = kept
        try:
            response = await self.store.get_response(previous, owner=client)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None
        if response is None:
            raise previous_not_found(previous)
        output = [*map(dict, response.get("output") or [])]
        history = cache.continuation(previous, stored, output)
        return history, (previous, len(stored)), affinity

    def continuation(self, turn: Turn) -> tuple[dict[str, Any], ...]:
        """`(*turn.items, *output)`: what a continuation of the turn starts from (a
        WebSocket's remembered response), marked on the kept turn as made from it."""
        output = turn.response.get("output") or []
        cache = self.options.history
        if cache is None:
            return (*turn.items, *output)
        return cache.continuation(turn.response["id"], turn.items, output)

    async def check_store(self, request: Mapping[str, Any]) -> None:
        """A `store: true` turn while the store is known to refuse writes: a 503 now,
        before any byte, rather than an answer that would not be kept."""
        if request.get("store") is False:
            return
        if not await self.store_health.writable():
            raise store_unavailable(StoreUnavailable("it did not take the last write"))

    async def history(self, previous: str, client: str | None) -> list[dict[str, Any]]:
        """The continued response's input then output; another client's is not found, and
        a store outage is a 503."""
        return _history_of(await self.continued(previous, client))

    async def continued(self, previous: str, client: str | None) -> StoredResponse | None:
        """The stored response `previous` names (None for ""); 400 if not found."""
        if not previous:
            return None
        if conversations.is_conversation_id(previous):  # a conversation is no response
            raise previous_not_found(previous)
        try:
            record = await self.store.get(previous, owner=client)
        except StoreUnavailable as exc:
            raise store_unavailable(exc) from None
        if record is None:
            raise previous_not_found(previous)
        return record

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
        self,
        turn: Turn,
        sink: Sink,
        transport: str,
        *,
        keep: Callable[[Turn], bool] = always,
        generate: bool = True,
    ) -> None:
        """Run one turn into `sink` and end it: the one place a turn ends, for every transport.

        Each ending is the turn's terminal event, sent as the sink's `final` batch once the
        response is stored (if `keep(turn)`, and unless `store: false`), so that a client
        can chain from it at once:

        - the backend's end, an output limit, the turn's deadline, or a backend failure
          mid-stream (`TurnEvents`): completed, incomplete or failed;
        - a refusal before the first event (the backend's, or the shutdown's): a
          `RequestError` raised with nothing sent, for the transport to answer; but a turn
          whose client holds the response already (a background turn, queued) ends failed;
        - stopped by the in-flight registry: a cancel ends it cancelled; the shutdown
          deadline ends it failed (`SHUT_DOWN`), or is a 503 if nothing was answered yet;
          a background turn ended by another instance (its lease lapsed) ends here unwritten;
        - the sink or the gateway failing under it: failed (the store's outage as
          `store_unavailable`), that end sent once more, the error raised if it fails too.

        A cancel the registry did not ask for (the client went away) ends nothing: it goes
        up, the backend let go. `generate=False` (a WebSocket warmup): created then
        completed at once, no backend call, not observed.
        """
        with self.in_flight.tracking():
            if not generate:
                batch = warmup(turn)
                if keep(turn) and not await self.remember(turn):
                    batch = unstored(batch)  # the response says store: false
                await sink.send(batch, True)
                return
            try:
                await self._observed(turn, sink, transport, keep)
            except RequestError as exc:
                if turn.response["status"] != "queued":  # nobody holds the response yet
                    raise
                streamer = turn.streamer  # a background turn refused: it ends failed
                failed = streamer.fail(exc.code or "server_error", exc.message, exc.type)
                batch = streamer.start() + failed
                await self._end(turn, sink, batch, keep)

    async def _observed(
        self, turn: Turn, sink: Sink, transport: str, keep: Callable[[Turn], bool]
    ) -> None:
        """The turn against its backend, observed (metrics, `--tap-dir`), batch by batch."""
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
                await self._settle(turn, batch, keep)  # it may now say store: false
                ending = []
                await sink.send(batch, True)
                return
        except asyncio.CancelledError:
            why = self.in_flight.stopped()
            if why is None:
                raise
            await events.close()
            await self._end(turn, sink, ending or self._stopped(turn, sink, why), keep)
        except (RequestError, ConnectionError):
            raise
        except Exception as exc:
            await events.close()
            await self._broken(turn, sink, exc, keep)
        finally:
            await events.close()
            seen.close()

    async def _end(
        self, turn: Turn, sink: Sink, tail: list[Event], keep: Callable[[Turn], bool]
    ) -> None:
        """Store the ended turn, then send its last batch (an interrupted send has already
        handed its bytes over, so only an unsent end is sent)."""
        if tail:
            await self._settle(turn, tail, keep)
            await sink.send(tail, True)

    async def _settle(self, turn: Turn, batch: list[Event], keep: Callable[[Turn], bool]) -> None:
        """What an ended turn leaves: its stored response (if the store failed, its last
        `batch` is rewritten in place to say `store: false`, as the response now does),
        its conversation's new items."""
        if keep(turn) and not await self.remember(turn):
            batch[:] = unstored(batch)
        if turn.conversation is not None:
            await self.extend_conversation(turn)

    @staticmethod
    def _stopped(turn: Turn, sink: Sink, why: Stop) -> list[Event]:
        """The end of a turn the registry stopped (none: it was ended elsewhere)."""
        if why is Stop.CANCEL:
            return turn.streamer.cancel()
        if why is Stop.TAKEN:
            return []
        if not sink.answered:  # nothing sent yet: still an HTTP error
            raise shutting_down() from None
        return turn.streamer.fail("server_error", SHUT_DOWN)

    async def _broken(
        self, turn: Turn, sink: Sink, exc: Exception, keep: Callable[[Turn], bool]
    ) -> None:
        """The sink (a background turn's store) or the gateway failed after the turn began:
        end it failed and try its end once more; the error goes up if that fails too, or
        if nothing was answered yet (an HTTP error then). An end already made (the store
        failed as it was written) is only sent again."""
        if not sink.answered:
            raise exc
        if isinstance(exc, StoreUnavailable):
            log.error("turn %s: the store failed under it: %s", turn.response["id"], exc)
            tail = turn.streamer.fail(STORE_UNAVAILABLE, STORE_FAILED)
        else:
            log.error("turn %s failed", turn.response["id"], exc_info=exc)
            tail = turn.streamer.fail("server_error", BROKEN)
        try:
            await self._settle(turn, tail, keep)
            await sink.send(tail, True)
        except Exception:
            raise exc from None

    async def remember(self, turn: Turn) -> bool:
        """Store a finished response unless the client said `store: false`; False when the
        store failed: the response then says `store: false` (the client is told through
        the Response's own field), counted and logged."""
        if turn.request.get("store") is False:
            return True
        record = stored(turn)
        try:
            await self.store.put(record)
        except Exception as exc:
            self.store_health.wrote(False)
            self.metrics.not_stored.inc()
            turn.response["store"] = False
            log.warning("could not store response %s (answered with store: false): %s",
                        turn.response["id"], exc)  # fmt: skip
            return False
        self.store_health.wrote(True)
        if self.options.history is not None:  # its continuation need not read it back
            self.options.history.recorded(
                record.id, record.owner, record.input_items, record.affinity
            )
        return True

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
        return await self.background.start(turn, self._run_background, self.in_flight)

    async def _run_background(self, turn: Turn, sink: Sink) -> None:
        await self.run(turn, sink, "background", keep=never)  # it writes its own record

    async def close(self) -> None:
        """Shutdown, after the drain: what it left of background turns is cancelled, then
        the upstreams and the store close."""
        self.quiet.close()
        await self.background.close()
        await self.upstreams.close()
        await self.store.close()
