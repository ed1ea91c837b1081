"""The metrics an operator alerts on (issue 32), each tried through a gateway and read from
`GET /metrics` with prometheus-client's own parser:

- turns by transport, model, replica and status (failed and refused: the errors);
- tokens by model, and by client key digest when client keys are set;
- backend time to first token and total time, by model;
- the model label bounded: a model neither the config nor the catalog names is `other`;
- queue waits, 429s (the gateway's own limit and the backend's), fallbacks, failovers;
- process metrics (RSS, CPU, open fds) and a build-info metric with the version.

Store errors by operation are `streamer_store_operations_total{outcome="error"}`
(tests/test_operators.py).
"""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from harness import GatewayHarness
from scripted_backend import (
    DONE,
    Gate,
    ScriptedBackend,
    Status,
    error_chunk,
    finish,
    refusing_url,
    text_chunks,
    usage,
)
from test_operators import scrape, value

from streamer import __version__
from streamer.app import create_app
from streamer.config import Settings
from streamer.core.identity import client_identity
from streamer.frontends.frontdoor import GuardedSite
from streamer.turns.genai_spans import replica_name

TEXT = [*text_chunks(["Hel", "lo"]), finish("stop"), usage(7, 2), DONE]
KEYS = ("sk-metrics-one", "sk-metrics-two")


async def test_turns_tokens_and_backend_times_by_model_replica_and_client() -> None:
    async with (
        GatewayHarness(api_keys=KEYS) as gw,
        aiohttp.ClientSession() as http,
    ):
        gw.backend.default_script = TEXT
        gw.backend.script(TEXT, TEXT, TEXT, [*text_chunks(["a"]), error_chunk("x", "dead"), DONE])
        for key, stream in ((KEYS[0], False), (KEYS[0], True), (KEYS[1], False), (KEYS[1], False)):
            body = {"model": "m", "input": "hi", "stream": stream}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(gw.url + "/responses", json=body, headers=headers) as resp:
                assert resp.status == 200
                answer = await resp.read()
        failed = orjson.loads(answer)  # the last: its usage is the gateway's estimate
        assert failed["status"] == "failed"
        headers = {"Authorization": f"Bearer {KEYS[0]}"}
        async with http.get(gw.url.removesuffix("/v1") + "/metrics", headers=headers) as resp:
            assert resp.status == 200
        samples = await scrape(http, gw)
    replica = replica_name(gw.settings.upstream or "")
    turns = "streamer_responses_total"
    assert value(samples, turns, transport="json", model="other", replica=replica,
                 status="completed") == 2  # fmt: skip
    assert value(samples, turns, transport="sse", model="other", replica=replica,
                 status="completed") == 1  # fmt: skip
    assert value(samples, turns, transport="json", model="other", replica=replica,
                 status="failed") == 1  # fmt: skip
    estimated = failed["usage"]
    tokens = "streamer_tokens_total"
    assert (
        value(samples, tokens, model="other", direction="input") == 21 + estimated["input_tokens"]
    )
    assert (
        value(samples, tokens, model="other", direction="output") == 6 + estimated["output_tokens"]
    )
    one, two = (client_identity(k)[:12] for k in KEYS)
    clients = "streamer_client_tokens_total"
    assert value(samples, clients, client=one, direction="input") == 14
    assert value(samples, clients, client=two, direction="output") == 2 + estimated["output_tokens"]
    assert value(samples, "streamer_backend_time_to_first_token_seconds_count", model="other") == 4
    assert value(samples, "streamer_backend_duration_seconds_count", model="other") == 4
    assert value(samples, "streamer_build_info", version=__version__,
                 python=platform.python_version()) == 1  # fmt: skip
    assert value(samples, "process_resident_memory_bytes") > 1 << 20
    assert value(samples, "process_open_fds") > 0
    assert value(samples, "process_cpu_seconds_total") > 0


async def test_without_client_keys_no_tokens_by_client() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "x"}) as resp:
            assert resp.status == 200
        samples = await scrape(http, gw)
    assert not [key for key in samples if key[0] == "streamer_client_tokens_total"]
    assert value(samples, "streamer_tokens_total", model="other", direction="input") > 0


class Configured:
    """A gateway serving a `--config` file."""

    def __init__(self, tmp_path: Path, config: str, **overrides: Any) -> None:
        path = tmp_path / "models.toml"
        path.write_text(config)
        self.settings = Settings(
            config=str(path), profile_probe=False, health_interval=0, **overrides
        )
        self.runner: Any = None
        self.url = ""

    async def __aenter__(self) -> Configured:
        self.runner = aiohttp.web.AppRunner(create_app(self.settings), handler_cancellation=True)
        await self.runner.setup()
        site = GuardedSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site.port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key="unused", max_retries=0)


DETOURS = """
[[models]]
name = "a"
upstreams = ["{dead0}", "{dead1}"]
fallbacks = ["b"]

[[models]]
name = "b"
upstreams = ["{good}"]

[[models]]
name = "c"
upstreams = ["{busy}"]
"""


async def test_failovers_fallbacks_and_the_backends_429_by_model(tmp_path: Path) -> None:
    dead = [refusing_url(), refusing_url()]
    limited = Status(429, {"error": {"message": "slow down", "code": "rate_limit_exceeded"}})
    async with (
        ScriptedBackend() as good,
        ScriptedBackend(default_script=[limited]) as busy,
    ):
        config = DETOURS.format(
            dead0=dead[0], dead1=dead[1], good=good.base_url, busy=busy.base_url
        )
        async with Configured(tmp_path, config) as gw, gw.sdk() as client:
            served = await client.responses.create(model="a", input="hi")
            assert served.model == "b"
            with pytest.raises(openai.RateLimitError):
                await client.responses.create(model="c", input="hi")
            async with aiohttp.ClientSession() as http:
                samples = await scrape(http, gw)  # type: ignore[arg-type]
    for url in dead:
        assert value(samples, "streamer_replica_failovers_total", model="a",
                     replica=replica_name(url)) == 1  # fmt: skip
    assert value(samples, "streamer_fallbacks_total", model="a", fallback="b") == 1
    assert value(samples, "streamer_rate_limited_total", model="c", source="backend") == 1
    turns = "streamer_responses_total"
    assert value(samples, turns, transport="json", model="b", replica=replica_name(good.base_url),
                 status="completed") == 1  # fmt: skip
    assert value(samples, turns, transport="json", model="c", replica=replica_name(busy.base_url),
                 status="refused") == 1  # fmt: skip


LIMITED = """
[[models]]
name = "one"
upstreams = ["{u}"]
max_concurrency = 1
"""


async def test_queue_waits_and_the_gateways_own_429(tmp_path: Path) -> None:
    gate = asyncio.Event()
    held = [*text_chunks(["a"]), Gate(gate), *text_chunks(["b"]), finish(), usage(1, 2), DONE]
    async with ScriptedBackend(default_script=held) as backend:
        config = LIMITED.format(u=backend.base_url)
        async with Configured(tmp_path, config, route_queue_seconds=0.05) as gw, gw.sdk() as client:
            stream = await client.responses.create(model="one", input="first", stream=True)
            events = aiter(stream)
            assert (await anext(events)).type == "response.created"  # it holds the one slot
            with pytest.raises(openai.RateLimitError):
                await client.responses.create(model="one", input="second")
            gate.set()
            assert [e.type async for e in events][-1] == "response.completed"
            async with aiohttp.ClientSession() as http:
                samples = await scrape(http, gw)  # type: ignore[arg-type]
    assert value(samples, "streamer_rate_limited_total", model="one", source="gateway") == 1
    assert value(samples, "streamer_route_queue_wait_seconds_count", model="one") == 2
    assert value(samples, "streamer_route_queue_wait_seconds_bucket", model="one", le="+Inf") == 2
