"""Issue 25, row 11: request fields out of OpenAI's ranges.

`temperature: 5`, `-1e308`, `top_p: 7`, `max_output_tokens: -5` got a 200, were echoed
in the Response and forwarded to the backend; OpenAI answers each with a 400 naming the
field. Now every bound that OpenAI's API reference and the openai SDK's types give is
checked with OpenAI's message and code, on both HTTP servers and the WebSocket, before
anything reaches the backend; a value at the bound itself is taken.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest
from harness import GatewayHarness

# (fields, param, code): each body is refused with that `param` and `code`
OUT_OF_RANGE: list[tuple[dict[str, Any], str, str]] = [
    ({"temperature": 5}, "temperature", "decimal_above_max_value"),
    ({"temperature": -1e308}, "temperature", "decimal_below_min_value"),
    ({"temperature": 2.0000001}, "temperature", "decimal_above_max_value"),
    ({"top_p": 7}, "top_p", "decimal_above_max_value"),
    ({"top_p": -0.1}, "top_p", "decimal_below_min_value"),
    ({"max_output_tokens": -5}, "max_output_tokens", "integer_below_min_value"),
    ({"max_output_tokens": 15}, "max_output_tokens", "integer_below_min_value"),
    ({"max_tool_calls": 0}, "max_tool_calls", "integer_below_min_value"),
    ({"top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
    ({"top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
    ({"presence_penalty": 2.5}, "presence_penalty", "decimal_above_max_value"),
    ({"frequency_penalty": -1e308}, "frequency_penalty", "decimal_below_min_value"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "object_above_max_properties"),
    ({"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 65, "property_name_above_max_length"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k", "string_above_max_length"),
    ({"prompt_cache_key": "p" * 65}, "prompt_cache_key", "string_above_max_length"),
    ({"safety_identifier": "s" * 129}, "safety_identifier", "string_above_max_length"),
    ({"input": "x" * (10_485_760 + 1)}, "input", "string_above_max_length"),
]
IDS = [
    f"{next(iter(fields))}={str(next(iter(fields.values())))[:12]}" for fields, _, _ in OUT_OF_RANGE
]
# At the bounds: taken, forwarded, echoed.
AT_THE_BOUNDS: list[dict[str, Any]] = [
    {"temperature": 0, "top_p": 0},
    {"temperature": 2, "top_p": 1, "max_output_tokens": 16, "max_tool_calls": 1},
    {"top_logprobs": 0, "presence_penalty": -2, "frequency_penalty": 2},
    {"metadata": {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}},
    {"prompt_cache_key": "p" * 64, "safety_identifier": "s" * 128},
]


def check_refusal(error: Any, param: str, code: str, fields: dict[str, Any]) -> None:
    assert isinstance(error, dict), error
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    name, value = next(iter(fields.items()))
    if code.startswith(("decimal", "integer")):  # OpenAI's words, the value as sent
        assert error["message"].startswith(f"Invalid '{name}': "), error
        assert f"but got {value} instead." in error["message"], error


@pytest.mark.parametrize(("fields", "param", "code"), OUT_OF_RANGE, ids=IDS)
@pytest.mark.parametrize("fast_http", [True, False], ids=["fast-http", "aiohttp"])
async def test_out_of_range_fields_are_a_400_naming_the_field(
    fields: dict[str, Any], param: str, code: str, fast_http: bool
) -> None:
    async with (
        GatewayHarness(fast_http=fast_http) as gw,
        openai.AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.responses.create(model="m", input="hi", stream=stream, extra_body=fields)
            check_refusal(caught.value.body, param, code, fields)
        assert gw.backend.requests == [], "an out-of-range request reached the backend"


async def test_out_of_range_fields_over_the_websocket_are_error_events() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(gw.ws_url, max_msg_size=0)
        for fields, param, code in OUT_OF_RANGE:
            frame = {"type": "response.create", "model": "m", "input": "hi", **fields}
            await ws.send_bytes(orjson.dumps(frame))
            event = orjson.loads((await ws.receive()).data)
            assert event["type"] == "error" and event["status"] == 400, event
            check_refusal(event["error"], param, code, fields)
        await ws.close()
        assert gw.backend.requests == []


@pytest.mark.parametrize("fields", AT_THE_BOUNDS)
async def test_values_at_the_bounds_are_taken_and_echoed(fields: dict[str, Any]) -> None:
    async with (
        GatewayHarness() as gw,
        openai.AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(model="m", input="hi", extra_body=fields)
        assert response.status == "completed"
        echoed = response.to_dict()
        for name in ("temperature", "top_p", "max_output_tokens", "metadata", "top_logprobs"):
            if name in fields:
                assert echoed[name] == fields[name], name
        assert len(gw.backend.requests) == 1


async def test_conversation_metadata_has_the_same_bounds() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        for fields, param, code in OUT_OF_RANGE:
            if "metadata" not in fields:
                continue
            async with http.post(gw.url + "/conversations", json=fields) as resp:
                error = (await resp.json())["error"]
                assert resp.status == 400, error
                check_refusal(error, param, code, fields)
        async with http.post(gw.url + "/conversations", json=AT_THE_BOUNDS[3]) as resp:
            assert resp.status == 200, await resp.text()
