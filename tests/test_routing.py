"""Several models behind one gateway (`--config`), with three scripted backends: routing by
name and alias, cache affinity, failover before the first byte, fallbacks that check what
the turn needs, the per-model concurrency limit, and SIGHUP reloads under load."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import websockets
from scripted_backend import DONE, Gate, ScriptedBackend, Status, finish, text_chunks, usage

from streamer.app import RELOADS, SIGHUP, create_app
from streamer.config import Settings
from streamer.core import routing
from streamer.frontends.frontdoor import GuardedSite
from streamer.frontends.http import GATEWAY
from streamer.turns.router import Limit

TOOLS = [{"type": "function", "name": "search", "parameters": {"type": "object"}}]


class Routed:
    """Three scripted backends and a gateway serving `config` (a template over `{u0}` …)."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        self.path = tmp_path / "streamer.toml"
        self.backends = [ScriptedBackend() for _ in range(3)]
        self.settings = Settings(
            config=str(self.path), profile_probe=False, health_interval=0, **overrides
        )
        self.runner: Any = None
        self.url = ""

    def write(self, template: str) -> None:
        urls = {f"u{i}": b.base_url for i, b in enumerate(self.backends)}
        self.path.write_text(template.format(**urls))

    async def start(self, template: str) -> Routed:
        for backend in self.backends:
            await backend.start()
        self.write(template)
        self.runner = aiohttp.web.AppRunner(create_app(self.settings), handler_cancellation=True)
        await self.runner.setup()
        site = GuardedSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site.port}/v1"
        return self

    @property
    def app(self) -> Any:
        return self.runner.app

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key="unused", max_retries=0)

    def served(self, text: str) -> list[int]:
        """Which backends got a request whose last message is `text` (one entry per request)."""
        return [i for i, b in enumerate(self.backends) for body in b.requests if last(body) == text]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        for backend in self.backends:
            await backend.stop()


def last(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else content[0]["text"]


TWO_MODELS = """
default_model = "local"

[[models]]
name = "local"
aliases = ["qwen3-coder"]
upstreams = ["{u0}", "{u1}"]
backend_model = "Qwen/Qwen3-Coder-30B-A3B"
context_window = 131072
input_modalities = ["text"]

[[models]]
name = "api"
upstreams = ["{u2}"]
backend_model = "deepseek-chat"
supports_reasoning = false
"""


async def test_routing_by_name_alias_and_default_and_404_for_another(tmp_path: Path) -> None:
    gw = await Routed(tmp_path).start(TWO_MODELS)
    try:
        client = gw.sdk()
        by_alias = await client.responses.create(model="qwen3-coder", input="one")
        assert by_alias.model == "local"  # the model that answered, not the alias
        by_name = await client.responses.create(model="api", input="two")
        assert by_name.model == "api" and by_name.output_text == "Hello!"
        assert gw.served("one")[0] in (0, 1) and gw.served("two") == [2]
        sent = [body["model"] for b in gw.backends for body in b.requests]
        assert sorted(sent) == ["Qwen/Qwen3-Coder-30B-A3B", "deepseek-chat"]
        async with (
            aiohttp.ClientSession() as http,  # no model: the default
            http.post(f"{gw.url}/responses", json={"input": "three"}) as resp,
        ):
            assert resp.status == 200 and (await resp.json())["model"] == "local"
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.create(model="gpt-5", input="four")
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "The model 'gpt-5' does not exist" in error["message"]
        assert gw.served("four") == []
        listed = await client.models.list()
        assert [m.id for m in listed.data] == ["local", "api"]
    finally:
        await gw.stop()


async def test_v1_models_describes_the_configured_models_for_codex(tmp_path: Path) -> None:
    gw = await Routed(tmp_path).start(TWO_MODELS)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/models") as resp:
            body = await resp.json()
        local, api = body["models"]
        assert local["slug"] == "local" and local["context_window"] == 131072
        assert local["input_modalities"] == ["text"]
        assert api["context_window"] == 128000 and api["supported_reasoning_levels"] == []
        assert all(not b.records for b in gw.backends)  # from the config, not the backends
    finally:
        await gw.stop()


THREE_REPLICAS = """
[[models]]
name = "local"
upstreams = ["{u0}", "{u1}", "{u2}"]
"""


async def _turns(gw: Routed, keys: list[str], concurrency: int = 16) -> list[int]:
    """One JSON turn per key (its text is the key), `concurrency` at once: the statuses."""
    gate = asyncio.Semaphore(concurrency)

    async def one(http: aiohttp.ClientSession, key: str) -> int:
        body = {"model": "local", "input": key, "prompt_cache_key": key.split("#")[0]}
        async with gate, http.post(f"{gw.url}/responses", json=body) as resp:
            await resp.read()
            return resp.status

    async with aiohttp.ClientSession() as http:
        return list(await asyncio.gather(*(one(http, k) for k in keys)))


def _homes(gw: Routed, keys: list[str]) -> dict[str, set[int]]:
    homes: dict[str, set[int]] = defaultdict(set)
    for i, backend in enumerate(gw.backends):
        for body in backend.requests:
            text = last(body)
            if text in keys:
                homes[text.split("#")[0]].add(i)
    return homes


async def test_1000_turns_over_200_cache_keys_each_key_on_one_replica(tmp_path: Path) -> None:
    gw = await Routed(tmp_path).start(THREE_REPLICAS)
    try:
        keys = [f"key-{n % 200}#{n}" for n in range(1000)]
        assert await _turns(gw, keys) == [200] * 1000
        homes = _homes(gw, keys)
        assert len(homes) == 200
        assert all(len(replicas) == 1 for replicas in homes.values())  # 100 %
        per_replica = [sum(1 for r in homes.values() if r == {i}) for i in range(3)]
        assert all(count > 30 for count in per_replica), per_replica  # rendezvous spreads them
    finally:
        await gw.stop()


async def test_a_replica_killed_mid_run_costs_no_client_error_and_only_its_keys_move(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await Routed(tmp_path).start(THREE_REPLICAS)
    try:
        before = [f"key-{n % 60}#a{n}" for n in range(180)]
        assert await _turns(gw, before) == [200] * 180
        first = {k: next(iter(r)) for k, r in _homes(gw, before).items()}
        await gw.backends[1].stop()  # killed: connections refused from now on
        with caplog.at_level(logging.WARNING, "streamer.routing"):
            after = [f"key-{n % 60}#b{n}" for n in range(180)]
            assert await _turns(gw, after) == [200] * 180  # no client error
        second = _homes(gw, after)
        assert all(len(r) == 1 for r in second.values())  # a moved key moved to one replica
        for key, home in first.items():
            if home == 1:
                assert second[key] <= {0, 2}
            else:  # rendezvous: the keys of the live replicas stay where they were
                assert second[key] == {home}
        assert sum(1 for h in first.values() if h == 1) > 5
        assert any("failed before the first byte" in r.message for r in caplog.records)
    finally:
        await gw.stop()


FALLBACKS = """
[[models]]
name = "local"
upstreams = ["{u0}"]
fallbacks = ["notools", "api"]

[[models]]
name = "notools"
upstreams = ["{u1}"]
supports_tools = false

[[models]]
name = "api"
upstreams = ["{u2}"]
backend_model = "api-backend"
"""


@pytest.mark.parametrize("status", [503, 429, 500])
async def test_failover_skips_a_fallback_without_tools(
    tmp_path: Path, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    gw = Routed(tmp_path)
    gw.backends[0].default_script = [Status(status, {"error": {"message": "overloaded"}})]
    await gw.start(FALLBACKS)
    try:
        client = gw.sdk()
        with caplog.at_level(logging.WARNING, "streamer.routing"):
            tooled = await client.responses.create(model="local", input="tools", tools=TOOLS)  # type: ignore[list-item]
        assert tooled.model == "api" and gw.served("tools") == [0, 2]
        assert gw.backends[2].requests[0]["model"] == "api-backend"
        assert "fallback notools skipped: it has no tools" in caplog.text
        plain = await client.responses.create(model="local", input="plain")
        assert plain.model == "notools" and gw.served("plain") == [0, 1]
        stream = await client.responses.create(model="local", input="streamed", stream=True)
        events = [event async for event in stream]
        assert events[0].type == "response.created"
        assert events[0].response.model == "notools"  # said from the first event on
        assert events[-1].type == "response.completed"
    finally:
        await gw.stop()


async def test_a_refusal_that_another_model_would_repeat_is_not_failed_over(
    tmp_path: Path,
) -> None:
    gw = Routed(tmp_path)
    gw.backends[0].default_script = [Status(400, {"error": {"message": "bad messages"}})]
    await gw.start(FALLBACKS)
    try:
        with pytest.raises(openai.BadRequestError, match="bad messages"):
            await gw.sdk().responses.create(model="local", input="x")
        assert gw.served("x") == [0]
    finally:
        await gw.stop()


def _gated(gate: asyncio.Event, arrived: list[Any], enough: asyncio.Event, count: int) -> Any:
    def respond(body: Any) -> list[Any]:
        arrived.append(body)
        if len(arrived) >= count:
            enough.set()
        return [*text_chunks(["a"]), Gate(gate), *text_chunks(["b"]), finish(), usage(1, 2), DONE]

    return respond


LIMITED = """
[[models]]
name = "local"
upstreams = ["{u0}", "{u1}"]
max_concurrency = 2
"""


async def _stream(client: openai.AsyncOpenAI, text: str, model: str = "local") -> str:
    stream = await client.responses.create(model=model, input=text, stream=True)
    events = [event.type async for event in stream]
    return events[-1]


async def test_the_concurrency_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    gw = Routed(tmp_path, route_queue_seconds=0.2)
    gate, enough, arrived = asyncio.Event(), asyncio.Event(), []
    for backend in gw.backends:
        backend.responder = _gated(gate, arrived, enough, 2)
    await gw.start(LIMITED)
    try:
        client = gw.sdk()
        running = [asyncio.create_task(_stream(client, f"s{i}")) for i in range(2)]
        await enough.wait()
        with pytest.raises(openai.RateLimitError) as caught:
            await client.responses.create(model="local", input="third")
        assert caught.value.response.headers["retry-after"] == "1"
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == "rate_limit_exceeded"
        assert "at its concurrency limit (2 at once)" in body["message"]
        assert gw.served("third") == []
        gate.set()
        assert await asyncio.gather(*running) == ["response.completed"] * 2
        after = await client.responses.create(model="local", input="fourth")  # slots back
        assert after.status == "completed"
    finally:
        await gw.stop()


async def test_a_request_over_the_limit_waits_for_a_slot(tmp_path: Path) -> None:
    gw = Routed(tmp_path, route_queue_seconds=60)
    gate, enough, arrived = asyncio.Event(), asyncio.Event(), []
    for backend in gw.backends:
        backend.responder = _gated(gate, arrived, enough, 2)
    await gw.start(LIMITED)
    try:
        client = gw.sdk()
        running = [asyncio.create_task(_stream(client, f"s{i}")) for i in range(3)]
        await enough.wait()
        limit = gw.app[GATEWAY].upstreams.router.table.routes["local"].limit
        while not limit.waiters:  # the third is queued (yielding, no timer)
            await asyncio.sleep(0)
        assert len(arrived) == 2
        gate.set()
        assert await asyncio.gather(*running) == ["response.completed"] * 3
        assert len(arrived) == 3 and limit.used == 0
    finally:
        await gw.stop()


RELOADED = """
[[models]]
name = "local"
aliases = ["renamed"]
upstreams = ["{u2}"]
"""


async def _sighup(gw: Routed) -> None:
    assert gw.app.get(SIGHUP)  # else the signal would end the test process
    reloads = gw.app[RELOADS]
    seen = reloads.seen
    os.kill(os.getpid(), signal.SIGHUP)
    for _ in range(10_000):  # the handler runs on one of the loop's next turns
        if reloads.seen > seen:
            break
        await asyncio.sleep(0)
    await asyncio.gather(*reloads.tasks)


async def test_a_reload_under_load_drops_no_stream(tmp_path: Path) -> None:
    gw = Routed(tmp_path)
    gate, enough, arrived = asyncio.Event(), asyncio.Event(), []
    for backend in gw.backends[:2]:
        backend.responder = _gated(gate, arrived, enough, 8)
    await gw.start(TWO_MODELS)
    try:
        client = gw.sdk()
        running = [asyncio.create_task(_stream(client, f"s{i}")) for i in range(8)]
        await enough.wait()  # eight streams under way on replicas 0 and 1
        gw.write(RELOADED)
        await _sighup(gw)
        table = gw.app[GATEWAY].upstreams.router.table
        assert [r.state.url for r in table.routes["local"].replicas] == [gw.backends[2].base_url]
        fresh = await client.responses.create(model="renamed", input="new")
        assert fresh.model == "local" and gw.served("new") == [2]
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="api", input="gone")
        gate.set()  # the old turns finish on the old config
        assert await asyncio.gather(*running) == ["response.completed"] * 8
        assert all(i in (0, 1) for n in range(8) for i in gw.served(f"s{n}"))
    finally:
        await gw.stop()


async def test_a_bad_file_on_reload_is_logged_and_the_old_config_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await Routed(tmp_path).start(TWO_MODELS)
    try:
        before = gw.app[GATEWAY].upstreams.router.table
        gw.write(TWO_MODELS + "\nbogus = 1\n")
        with caplog.at_level(logging.ERROR, "streamer.routing"):
            await _sighup(gw)
        assert "config not reloaded, the old one is kept" in caplog.text
        assert "bogus: unknown key 'bogus'" in caplog.text
        assert gw.app[GATEWAY].upstreams.router.table is before
        answer = await gw.sdk().responses.create(model="api", input="still")
        assert answer.model == "api"
    finally:
        await gw.stop()


async def test_a_previous_response_id_chain_and_a_websocket_keep_to_one_replica(
    tmp_path: Path,
) -> None:
    gw = await Routed(tmp_path).start(THREE_REPLICAS)
    try:
        client = gw.sdk()
        previous = None
        for n in range(12):
            answer = await client.responses.create(
                model="local", input=f"chain-{n}", previous_response_id=previous
            )
            previous = answer.id
        assert len({gw.served(f"chain-{n}")[0] for n in range(12)}) == 1
        ws_url = gw.url.replace("http://", "ws://") + "/responses"
        async with websockets.connect(ws_url) as ws:
            for n in range(12):
                frame = {"type": "response.create", "model": "local", "input": f"ws-{n}"}
                await ws.send(json.dumps({**frame, "store": False}))  # no chain: the socket
                while json.loads(await ws.recv())["type"] != "response.completed":
                    pass
        assert len({gw.served(f"ws-{n}")[0] for n in range(12)}) == 1
    finally:
        await gw.stop()


def test_rendezvous_moves_few_keys_when_a_replica_is_added() -> None:
    three = [routing.ReplicaState(f"http://r{i}/v1") for i in range(3)]
    four = [*three, routing.ReplicaState("http://r3/v1")]
    keys = [f"k{n}" for n in range(2000)]
    moved = [k for k in keys if routing.rank(four, k, 0)[0] != routing.rank(three, k, 0)[0]]
    assert all(routing.rank(four, k, 0)[0] == 3 for k in moved)  # only to the new one
    assert 300 < len(moved) < 700  # about a quarter


def test_unhealthy_replicas_come_last_and_keyless_turns_go_to_the_fewest_in_flight() -> None:
    replicas = [
        routing.ReplicaState(f"http://r{i}/v1", in_flight=n) for i, n in enumerate((3, 1, 2))
    ]
    assert routing.rank(replicas, None, 0) == [1, 2, 0]
    routing.mark_failed(replicas[1], now=0, cooldown=10)
    assert routing.rank(replicas, None, 5) == [2, 0, 1]
    assert routing.rank(replicas, None, 11) == [1, 2, 0]  # the cooldown passed
    assert routing.needs({"reasoning": {"effort": "high"}}, {"tools": [{}]}).missing(
        True, True, False
    ) == ["reasoning"]
    assert replace(routing.Needs(), images=True).missing(True, False, True) == ["images"]


async def test_a_waiter_that_gives_up_never_keeps_a_slot() -> None:
    limit = Limit(1)
    assert await limit.acquire(0)
    assert not await limit.acquire(0)  # full, and no wait allowed
    waiting = asyncio.create_task(limit.acquire(60))
    while not limit.waiters:
        await asyncio.sleep(0)
    waiting.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await waiting
    limit.release()
    assert limit.used == 0 and not limit.waiters
    assert await limit.acquire(0)


async def test_an_active_health_check_takes_a_dead_replica_out_before_any_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw = Routed(tmp_path)
    gw.settings = replace(gw.settings, health_interval=0.05)
    await gw.start(THREE_REPLICAS)
    try:
        replicas = gw.app[GATEWAY].upstreams.router.table.routes["local"].replicas
        with caplog.at_level(logging.WARNING, "streamer.routing"):
            await gw.backends[1].stop()
            for _ in range(100_000):  # until a check found it (no turn sent meanwhile)
                if not replicas[1].state.healthy:
                    break
                await asyncio.sleep(0.001)
            assert not replicas[1].state.healthy and replicas[0].state.healthy
            keys = [f"key-{n}" for n in range(30)]
            assert await _turns(gw, keys) == [200] * 30
        assert f"replica {gw.backends[1].base_url} failed its health check" in caplog.text
        assert {i for k in keys for i in gw.served(k)} == {0, 2}
    finally:
        await gw.stop()


PROFILED = """
[[models]]
name = "local"
upstreams = ["{u0}"]
fallbacks = ["api"]

[[models]]
name = "api"
upstreams = ["{u2}"]
profile = "openai"
backend_model = "gpt-x"
"""


async def test_a_fallback_gets_the_request_lowered_with_its_own_profile(tmp_path: Path) -> None:
    gw = Routed(tmp_path)
    gw.backends[0].default_script = [Status(502, {"error": {"message": "bad gateway"}})]
    await gw.start(PROFILED)
    try:
        answer = await gw.sdk().responses.create(
            model="local", input="profiled", max_output_tokens=50
        )
        assert answer.model == "api"
        local, api = gw.backends[0].requests[0], gw.backends[2].requests[0]
        assert local["max_tokens"] == 50 and "max_completion_tokens" not in local
        assert api["max_completion_tokens"] == 50 and "max_tokens" not in api
        assert api["model"] == "gpt-x" and local["model"] == "local"
    finally:
        await gw.stop()


async def test_streamer_serve_config_reloads_on_sighup_with_a_stream_in_flight(
    tmp_path: Path,
) -> None:
    """The real process: `streamer serve --config`, one stream held open across `kill -HUP`."""
    from builders import gateway_process

    backends = [ScriptedBackend() for _ in range(2)]
    gate, enough, arrived = asyncio.Event(), asyncio.Event(), []
    backends[0].responder = _gated(gate, arrived, enough, 1)
    for backend in backends:
        await backend.start()
    path = tmp_path / "streamer.toml"
    path.write_text(f'[[models]]\nname = "a"\nupstreams = ["{backends[0].base_url}"]\n')
    try:
        async with gateway_process(tmp_path / "gw.log", "--config", str(path)) as gw:
            # the startup line names the file's models, not the embedded scripted model
            assert f"-> {path}: a (chat) -> {backends[0].base_url} (pid" in gw.stdout()
            client = openai.AsyncOpenAI(base_url=gw.url, api_key="unused", max_retries=0)
            held = asyncio.create_task(_stream(client, "held", model="a"))
            await enough.wait()
            path.write_text(f'[[models]]\nname = "b"\nupstreams = ["{backends[1].base_url}"]\n')
            gw.process.send_signal(signal.SIGHUP)
            async with asyncio.timeout(30):  # the process says so in its log
                while "config reloaded" not in gw.stderr():
                    await asyncio.sleep(0.05)
            after = await client.responses.create(model="b", input="after")
            assert after.model == "b" and len(backends[1].requests) == 1
            with pytest.raises(openai.NotFoundError):
                await client.responses.create(model="a", input="gone")
            gate.set()
            assert await held == "response.completed"  # begun on the old config, ended well
    finally:
        for backend in backends:
            await backend.stop()


def test_the_chains_remembered_are_bounded_by_affinity_entries() -> None:
    chains = routing.Chains(2)
    assert chains.key_for("r1", {}, None) == "chain:r1"
    assert chains.key_for("r2", {"previous_response_id": "r1"}, None) == "chain:r1"
    assert chains.key_for("r3", {"previous_response_id": "r2"}, None) == "chain:r1"
    assert len(chains.keys) == 2 and "r2" not in chains.keys  # its successor r3 holds the key
    assert chains.key_for("r4", {"prompt_cache_key": "t"}, "ws1") == "cache:t"
    assert chains.key_for("r5", {}, "ws1") == "socket:ws1"
    assert chains.key_for("r6", {"store": False}, None) is None  # nothing continues it
    assert len(chains.keys) == 2


async def test_a_wrong_body_or_model_type_is_a_400_naming_it_not_a_missing_model(
    tmp_path: Path,
) -> None:
    gw = await Routed(tmp_path).start(FALLBACKS)  # no default_model
    try:
        async with aiohttp.ClientSession() as http:
            for body, message in (
                ([1], "The request body must be a JSON object."),
                ({"model": 5, "input": "x"}, "Invalid type for 'model': expected a string."),
                ({"input": "x"}, "Missing required parameter: 'model'."),
            ):
                async with http.post(f"{gw.url}/responses", json=body) as resp:
                    assert resp.status == 400
                    assert (await resp.json())["error"]["message"] == message
    finally:
        await gw.stop()


async def test_a_model_on_a_responses_backend_beside_a_chat_one(tmp_path: Path) -> None:
    from scripted_responses_backend import ScriptedResponsesBackend

    gw = Routed(tmp_path)
    gw.backends[2] = ScriptedResponsesBackend(personality="flat")
    await gw.start(TWO_MODELS.replace('backend_model = "deepseek-chat"', 'api = "responses"'))
    try:
        client = gw.sdk()
        chat = await client.responses.create(model="local", input="one", tools=TOOLS)
        native = await client.responses.create(model="api", input="two", tools=TOOLS)
        assert chat.output_text == native.output_text == "Hello!"
        assert native.model == "api"
        assert sum(len(b.requests) for b in gw.backends[:2]) == 1  # "local": Chat
        (sent,) = gw.backends[2].requests  # POST /v1/responses, the gateway keeping state
        assert sent["model"] == "api" and sent["stream"] is True and sent["store"] is False
        assert [t["name"] for t in sent["tools"]] == ["search"]
    finally:
        await gw.stop()


ACROSS_KINDS = """
[[models]]
name = "first"
upstreams = ["{u0}"]
api = "FIRST"
fallbacks = ["second"]

[[models]]
name = "second"
upstreams = ["{u2}"]
api = "SECOND"
backend_model = "second-backend"
"""
HISTORY = [
    {"type": "message", "role": "user", "content": "Fix the parser"},
    {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "found it"},
]


async def _fall_back(tmp_path: Path, first: str, second: str) -> tuple[Routed, list[Any]]:
    """A model of kind `first` whose backend answers 503, falling back to one of kind
    `second`: a turn with tools and history, then a compaction turn, both served by the
    fallback; what the fallback's backend was sent."""
    from scripted_responses_backend import ScriptedResponsesBackend

    gw = Routed(tmp_path)
    kinds = {"chat": ScriptedBackend, "responses": ScriptedResponsesBackend}
    gw.backends[0] = kinds[first](default_script=[Status(503, {"error": {"message": "down"}})])
    gw.backends[2] = kinds[second]()
    await gw.start(ACROSS_KINDS.replace("FIRST", first).replace("SECOND", second))
    client = gw.sdk()
    answer = await client.responses.create(model="first", input=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
    assert answer.model == "second" and answer.output_text == "Hello!"
    compacted = await client.responses.compact(model="first", input=HISTORY)  # type: ignore[arg-type]
    assert compacted.output[-1].type == "compaction"
    assert len(gw.backends[0].requests) == 2  # each turn tried the first model first
    return gw, gw.backends[2].requests


async def test_a_chat_model_falls_back_to_a_responses_model_with_a_responses_body(
    tmp_path: Path,
) -> None:
    """The fallback is sent what its kind takes at its `/v1/responses` URL (issue 26: it
    was sent the Chat body, `messages` and Chat-shaped tools, for the first model's kind)."""
    from streamer.core.compaction import HANDOVER_PROMPT

    gw, (turn, compaction) = await _fall_back(tmp_path, "chat", "responses")
    try:
        for sent in (turn, compaction):
            assert "messages" not in sent and sent["model"] == "second-backend"
            assert sent["stream"] is True and sent["store"] is False
            assert sent["input"][0] == {
                "type": "message",
                "role": "user",
                "content": "Fix the parser",
            }
            assert sent["input"][1]["type"] == "function_call"
        assert turn["tools"] == [
            {"type": "function", "name": "search", "parameters": {"type": "object"}}
        ]
        assert "tools" not in compaction
        assert compaction["input"][-1] == {
            "type": "message",
            "role": "user",
            "content": HANDOVER_PROMPT,
        }
    finally:
        await gw.stop()


async def test_a_responses_model_falls_back_to_a_chat_model_with_a_chat_body(
    tmp_path: Path,
) -> None:
    """The reverse: a Chat fallback is sent Chat Completions (the compaction turn too: it
    was sent the first model's Responses body, `input` and no `messages`)."""
    from streamer.core.compaction import HANDOVER_PROMPT

    gw, (turn, compaction) = await _fall_back(tmp_path, "responses", "chat")
    try:
        for sent in (turn, compaction):
            assert "input" not in sent and "store" not in sent
            assert sent["model"] == "second-backend" and sent["stream"] is True
            assert sent["messages"][0] == {"role": "user", "content": "Fix the parser"}
            assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == "search"
            assert sent["messages"][2] == {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "found it",
            }
        assert turn["tools"][0]["function"]["name"] == "search"
        assert "tools" not in compaction
        assert compaction["messages"][-1] == {"role": "user", "content": HANDOVER_PROMPT}
    finally:
        await gw.stop()


OWN_SETTINGS = """
[[models]]
name = "local"
upstreams = ["{u0}"]
max_tokens_field = "max_tokens"    # over the gateway's --max-tokens-field
drop_params = "user,stream_options"

[[models]]
name = "api"
upstreams = ["{u2}"]
"""


async def test_a_model_sets_its_own_profile_settings_over_the_gateways(tmp_path: Path) -> None:
    """A `[[models]]` entry sets a profile setting by its name; the others keep the flag's."""
    gw = await Routed(tmp_path, max_tokens_field="max_completion_tokens").start(OWN_SETTINGS)
    try:
        client = gw.sdk()
        for model in ("local", "api"):
            await client.responses.create(model=model, input=model, max_output_tokens=19)
        (local,), (api,) = gw.backends[0].requests, gw.backends[2].requests
        assert local["max_tokens"] == 19 and "max_completion_tokens" not in local
        assert "stream_options" not in local  # the model's drop: no usage asked for
        assert api["max_completion_tokens"] == 19 and "max_tokens" not in api
        assert api["stream_options"] == {"include_usage": True}
    finally:
        await gw.stop()
