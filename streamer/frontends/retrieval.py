"""Routes over stored responses: GET, DELETE, input_items, cancel, and stream resume.

Each looks the response up as the asking client (`_owner`): another client's
response is not found, whatever the route.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web

from streamer.core.errors import RequestError, invalid
from streamer.frontends.api_keys import CLIENT
from streamer.frontends.background import RUNNING, follow
from streamer.frontends.http import GATEWAY, json_response
from streamer.turns.conversations import is_conversation_id


def _not_found(response_id: str) -> RequestError:
    return RequestError(
        f"Response with id '{response_id}' not found.",
        status=404,
        param="response_id",
        code="not_found",
    )


def _response_id(request: web.Request) -> str:
    """The id in the path; a conversation's (kept in the same store) is no response."""
    response_id = request.match_info["id"]
    if is_conversation_id(response_id):
        raise _not_found(response_id)
    return response_id


def int_arg(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise invalid(f"Invalid '{name}': expected an integer.", name, "invalid_type") from None


def page_args(request: web.Request) -> tuple[int, Literal["asc", "desc"]]:
    """`limit` (1-100, default 20) and `order` (default desc) of a list route."""
    limit = int_arg(request, "limit", 20)
    if not 1 <= limit <= 100:
        raise invalid("Invalid 'limit': expected an integer between 1 and 100.", "limit")
    order: Literal["asc", "desc"]
    match request.query.get("order", "desc"):
        case "asc":
            order = "asc"
        case "desc":
            order = "desc"
        case _:
            raise invalid("Invalid 'order': expected 'asc' or 'desc'.", "order")
    return limit, order


def owner_of(request: web.Request) -> str:
    """Who asks: only that client's responses are found."""
    return request.app[GATEWAY].client(request.get(CLIENT), request.headers)


async def get_response(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{id}; with `stream=true`, replay after `starting_after` and follow."""
    gateway = request.app[GATEWAY]
    response_id = _response_id(request)
    response = await gateway.store.get_response(response_id, owner=owner_of(request))
    if response is None:
        raise _not_found(response_id)
    if request.query.get("stream", "").lower() not in ("true", "1"):
        return json_response(response)
    if not response.get("background"):
        raise invalid("Only background responses can be streamed again.", "stream")
    after = int_arg(request, "starting_after", -1)
    return await follow(request, gateway.store, response_id, after=after)


async def delete_response(request: web.Request) -> web.Response:
    """DELETE /v1/responses/{id}; a running background turn is cancelled first, so it
    cannot write its record back after the delete."""
    gateway = request.app[GATEWAY]
    response_id = _response_id(request)
    owner = owner_of(request)
    response = await gateway.store.get_response(response_id, owner=owner)
    if response is None:
        raise _not_found(response_id)
    if response.get("background") and response.get("status") in RUNNING:
        await gateway.background.cancel(response_id)
    if not await gateway.store.delete(response_id, owner=owner):
        raise _not_found(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    response_id = _response_id(request)
    limit, order = page_args(request)
    page = await gateway.store.input_items(
        response_id,
        limit=limit,
        order=order,
        after=request.query.get("after"),
        owner=owner_of(request),
    )
    if page is None:
        raise _not_found(response_id)
    return json_response(page)


async def cancel_response(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    response_id = _response_id(request)
    # the owner is checked here: the cancel itself runs as the gateway, on any instance
    if await gateway.store.get_response(response_id, owner=owner_of(request)) is None:
        raise _not_found(response_id)
    response = await gateway.background.cancel(response_id)
    if response is None:
        raise _not_found(response_id)
    return json_response(response)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/responses/{id}", get_response)
    app.router.add_delete("/v1/responses/{id}", delete_response)
    app.router.add_get("/v1/responses/{id}/input_items", list_input_items)
    app.router.add_post("/v1/responses/{id}/cancel", cancel_response)
