"""`POST /v1/responses/input_tokens`: how many tokens a request's input would take.

The body is a create request (`client.responses.input_tokens.count(...)`); it is validated
and lowered exactly as a turn would be (its `previous_response_id` history included), then
counted by the backend's tokenizer where its profile names one
(streamer/upstream/chat/tokenize.py), else estimated and marked `estimated: true`. A
tokenizer that fails (an older server without the route, an unknown model) is not the
client's error: the answer is the estimate. Nothing is generated or stored.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from streamer.core.errors import RequestError, invalid
from streamer.frontends.api_keys import CLIENT
from streamer.frontends.http import GATEWAY, json_response, read_json
from streamer.upstream.chat.tokenize import (
    TOKENIZERS,
    TokenizerAPI,
    count_of,
    estimate,
    input_tokens_object,
    prompt_of,
    template_body,
    tokenize_body,
)

log = logging.getLogger("streamer.frontends.input_tokens")

_PLACEHOLDER_MODEL = "input-tokens"  # lets a body without `model` through validation
_NOT_COUNTED = ("stream", "background", "store", "stream_options")


async def count_input_tokens(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    given_model = isinstance(body.get("model"), str) and bool(body["model"])
    body = {k: v for k, v in body.items() if k not in _NOT_COUNTED}
    if not given_model and body.get("model") is None:
        body["model"] = _PLACEHOLDER_MODEL  # the model is optional here
    authorization = request.headers.get("Authorization")
    client = gateway.client(request.get(CLIENT), request.headers)
    turn = await gateway.prepare(body, client=client, authorization=authorization)
    chat = dict(turn.backend_request)
    if not given_model and gateway.settings.model is None:
        chat.pop("model", None)  # the backend's own default model counts it
    api = TOKENIZERS.get(gateway.upstreams.options(turn).profile.tokenizer or "")
    counted = None
    if api is not None:
        upstream = gateway.upstreams.replica(turn)
        counted = await _count(upstream, api, chat, turn.headers, turn.client)
    if counted is None:
        return json_response(input_tokens_object(estimate(chat), estimated=True))
    return json_response(input_tokens_object(counted, estimated=False))


async def _count(
    upstream: Any, api: TokenizerAPI, chat: dict[str, Any], headers: dict[str, str], client: str
) -> int | None:
    """The backend tokenizer's count, or None (logged) when it cannot give one."""
    try:
        prompt = None
        if api.template_path is not None:
            status, answer = await upstream.post_json(
                api.template_path, template_body(chat), headers=headers, client=client
            )
            if status != 200:
                raise ValueError(f"{api.template_path} answered {status}")
            prompt = prompt_of(answer)
        status, answer = await upstream.post_json(
            api.tokenize_path, tokenize_body(api, chat, prompt), headers=headers, client=client
        )
        if status != 200:
            raise ValueError(f"{api.tokenize_path} answered {status}")
        return count_of(answer)
    except (RequestError, ValueError) as exc:
        log.warning("the backend's tokenizer (%s) gave no count, estimating: %s", api.name, exc)
        return None


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses/input_tokens", count_input_tokens)
