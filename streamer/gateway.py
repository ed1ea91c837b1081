"""The gateway's per-process state: settings, the upstream client, the store.

It turns a client body into a prepared `Turn` (continuing a stored response when the
body names `previous_response_id`) and stores finished responses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from streamer.config import Settings
from streamer.core.errors import RequestError, invalid
from streamer.core.lowering import LoweringOptions
from streamer.core.tools import NamingConfig
from streamer.identity import CLIENT, request_client
from streamer.metrics import Metrics
from streamer.pipeline import Turn, TurnOptions, Upstream, prepare
from streamer.quiet_trim import QuietTrim, malloc_trim
from streamer.recorder import TapDirectory
from streamer.store import ResponseStore, StoredResponse

if TYPE_CHECKING:
    from streamer.frontends.background import Background

log = logging.getLogger("streamer.gateway")


def turn_options(settings: Settings) -> TurnOptions:
    if settings.tool_name_style not in ("codex", "double-underscore", "llamacpp", "dotted"):
        raise ValueError(f"unknown tool name style {settings.tool_name_style!r}")
    for flag, value in (
        ("--max-output-bytes", settings.max_output_bytes),
        ("--max-output-items", settings.max_output_items),
        ("--max-turn-seconds", settings.max_turn_seconds),
        ("--max-backend-json-bytes", settings.max_backend_json_bytes),
    ):
        if not value > 0:  # 0 would refuse every turn, not lift the limit: say so now
            raise ValueError(f"{flag} must be positive (got {value!r})")
    return TurnOptions(
        naming=NamingConfig(
            style=settings.tool_name_style,  # type: ignore[arg-type]
            max_name_length=settings.max_tool_name_length,
            max_tools=settings.max_tools,
            max_tool_bytes=settings.max_tool_bytes,
        ),
        lowering=LoweringOptions(model=settings.model, replay_reasoning=settings.replay_reasoning),
        max_input_items=settings.max_input_items,
        max_output_bytes=settings.max_output_bytes,
        max_output_items=settings.max_output_items,
        max_turn_seconds=settings.max_turn_seconds,
    )


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


class Gateway:
    def __init__(self, settings: Settings, upstream: Upstream, store: ResponseStore) -> None:
        self.settings = settings
        self.upstream = upstream
        self.store = store
        self.options = turn_options(settings)
        self.background: Background
        self.stats: dict[str, int] = {"http_turns": 0, "ws_connections": 0, "ws_turns": 0}
        self.metrics = Metrics()
        self.tap = TapDirectory(settings.tap_dir) if settings.tap_dir else None
        self.quiet = QuietTrim(
            settings.trim_after, malloc_trim() if settings.trim_after > 0 else None
        )

    async def prepare(
        self,
        body: Any,
        request: web.Request | None = None,
        *,
        history: Sequence[Mapping[str, Any]] | None = None,
    ) -> Turn:
        """Validate, continue from the store if asked, and lower one request."""
        client = self.client(request) if request is not None else None
        if history is None:
            history = await self.history(body, client)
        turn = prepare(body, self.options, history=history)
        if client is not None:
            turn.client = client
        if request is not None and self.settings.forward_authorization:
            auth = request.headers.get("Authorization")
            if auth:
                turn.headers["Authorization"] = auth
        return turn

    def client(self, request: web.Request) -> str:
        """The identity a request acts as: it owns what it stores, sees only that."""
        return request_client(
            request.get(CLIENT),
            request.headers,
            forward_authorization=self.settings.forward_authorization,
        )

    async def history(self, body: Any, client: str | None = None) -> list[dict[str, Any]]:
        """The continued response's input then output; another client's is not found."""
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if not previous or not isinstance(previous, str):
            return []  # absent, or a type error that validation reports with its param
        # StoreUnavailable: a 503, never a hang
        record = await self.store.get(previous, owner=client)
        if record is None:
            raise previous_not_found(previous)
        return continuation(record.input_items, record.response.get("output") or [])

    async def remember(self, turn: Turn) -> None:
        """Store a finished response unless the client said `store: false`."""
        if turn.request.get("store") is False:
            return
        try:
            await self.store.put(stored(turn))
        except Exception as exc:  # the client already has its answer; say so in the log
            log.warning("could not store response %s: %s", turn.response["id"], exc)


def stored(turn: Turn) -> StoredResponse:
    """What the store keeps of a turn: the public response, the input as listed, and who
    asked (the owner)."""
    return StoredResponse(
        turn.response,
        [public_input_item(item) for item in turn.items],
        turn.client or None,
    )


def public_input_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as `input_items` lists it: message text as a list of content parts.

    Still a valid input item, so a continuation replays it unchanged.
    """
    content = item.get("content")
    if item.get("type") != "message" or not isinstance(content, str):
        return item
    kind = "output_text" if item.get("role") == "assistant" else "input_text"
    part: dict[str, Any] = {"type": kind, "text": content}
    if kind == "output_text":
        part["annotations"] = []
    return {**item, "content": [part]}


GATEWAY = web.AppKey("gateway", Gateway)
