"""The Conversations API routes (`/v1/conversations`, its items), on the gateway's store.

Each route acts as the asking client: another client's conversation is not found. The
records and their limits are streamer/turns/conversations.py's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from streamer.core.errors import RequestError, invalid
from streamer.frontends.http import GATEWAY, json_response, read_json
from streamer.frontends.retrieval import owner_of, page_args
from streamer.store import StoredResponse
from streamer.store.base import page_items
from streamer.turns.conversations import Conversations, check_metadata, new_items, not_found


def _conversations(request: web.Request) -> Conversations:
    return request.app[GATEWAY].conversations


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    return body


async def _record(request: web.Request) -> StoredResponse:
    return await _conversations(request).require(
        request.match_info["id"], owner_of(request) or None
    )


async def create(request: web.Request) -> web.Response:
    """POST /v1/conversations {items?, metadata?}."""
    body = await _body(request)
    metadata = check_metadata(body.get("metadata"))
    items = new_items(body.get("items"), "items")
    record = await _conversations(request).create(metadata, items, owner_of(request))
    return json_response(record.response)


async def retrieve(request: web.Request) -> web.Response:
    return json_response((await _record(request)).response)


async def update(request: web.Request) -> web.Response:
    """POST /v1/conversations/{id} {metadata}."""
    body = await _body(request)
    if "metadata" not in body:
        raise invalid("Missing required parameter: 'metadata'.", "metadata")
    record = await _record(request)
    record.response["metadata"] = check_metadata(body["metadata"])
    await _conversations(request).put(record)
    return json_response(record.response)


async def delete(request: web.Request) -> web.Response:
    conversation_id = request.match_info["id"]
    await _record(request)  # the owner is checked here
    if not await request.app[GATEWAY].store.delete(conversation_id, owner=owner_of(request)):
        raise not_found(conversation_id)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: web.Request) -> web.Response:
    """GET /v1/conversations/{id}/items?limit&order&after (newest first by default)."""
    limit, order = page_args(request)
    record = await _record(request)
    page = page_items(
        record.input_items, limit=limit, order=order, after=request.query.get("after")
    )
    return json_response(page)


async def add_items(request: web.Request) -> web.Response:
    """POST /v1/conversations/{id}/items {items}: the items added, as a list."""
    body = await _body(request)
    if "items" not in body:
        raise invalid("Missing required parameter: 'items'.", "items")
    items = new_items(body["items"], "items")
    record = await _record(request)
    await _conversations(request).append(record, items)
    return json_response(page_items(items, limit=max(1, len(items)), order="asc", after=None))


def _item_not_found(item_id: str) -> RequestError:
    return RequestError(
        f"Item with id '{item_id}' not found.", status=404, param="item_id", code="not_found"
    )


async def retrieve_item(request: web.Request) -> web.Response:
    item_id = request.match_info["item_id"]
    record = await _record(request)
    for item in record.input_items:
        if item.get("id") == item_id:
            return json_response(item)
    raise _item_not_found(item_id)


async def delete_item(request: web.Request) -> web.Response:
    """DELETE /v1/conversations/{id}/items/{item_id}: the conversation."""
    item_id = request.match_info["item_id"]
    record = await _record(request)
    kept = [item for item in record.input_items if item.get("id") != item_id]
    if len(kept) == len(record.input_items):
        raise _item_not_found(item_id)
    record.input_items = kept
    await _conversations(request).put(record)
    return json_response(record.response)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/conversations", create)
    app.router.add_get("/v1/conversations/{id}", retrieve)
    app.router.add_post("/v1/conversations/{id}", update)
    app.router.add_delete("/v1/conversations/{id}", delete)
    app.router.add_get("/v1/conversations/{id}/items", list_items)
    app.router.add_post("/v1/conversations/{id}/items", add_items)
    app.router.add_get("/v1/conversations/{id}/items/{item_id}", retrieve_item)
    app.router.add_delete("/v1/conversations/{id}/items/{item_id}", delete_item)
