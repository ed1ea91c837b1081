"""What operators see: /metrics, request ids and structured logs, health, settings.

- `GET /metrics`: Prometheus text (parsed with prometheus-client's own parser) with
  requests by route and status, active streams and sockets, events sent, time to first
  event and duration histograms, backend errors by kind and store operations.
- Logs: one JSON object per line carrying the request id the answer's `X-Request-Id`
  names; nothing at the default level for ordinary traffic, access lines at `info`.
- `GET /healthz` (up) and `GET /readyz` (backend and store reachable, 503 otherwise).
- Every setting is a flag and an environment variable, and docs/settings.md lists them all.

`gateway_process` (a real `python -m streamer serve` with its own environment) is in
tests/builders.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import gateway_process
from harness import GatewayHarness
from prometheus_client.parser import text_string_to_metric_families
from redis_server import free_port
from scripted_backend import (
    DONE,
    ScriptedBackend,
    Sleep,
    Status,
    error_chunk,
    finish,
    refusing_url,
    text_chunks,
    usage,
)

from streamer.config import SETTINGS, Settings, settings_table

REPO = Path(__file__).resolve().parent.parent
TEXT = [*text_chunks(["Hel", "lo"]), finish("stop"), usage(3, 2), DONE]


# -- /metrics ------------------------------------------------------------------------------


async def scrape(http: aiohttp.ClientSession, gw: GatewayHarness) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # fmt: skip
    """Every sample of `GET /metrics`, parsed as Prometheus text."""
    async with http.get(gw.url.removesuffix("/v1") + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


async def test_metrics_count_what_operators_need() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        responses = gw.url + "/responses"
        # a JSON turn, an SSE turn, a bad request, an unknown route
        async with http.post(responses, json={"model": "m", "input": "hi"}) as resp:
            first = orjson.loads(await resp.read())
        async with http.post(responses, json={"model": "m", "input": "hi", "stream": True}) as resp:
            sse = await resp.read()
        async with http.post(responses, json={"model": "m", "input": 5}) as resp:
            assert resp.status == 400
        async with http.get(gw.url + "/nope") as resp:
            assert resp.status == 404
        # the store: a continuation reads, an unknown id misses, every turn writes
        body = {"model": "m", "input": "more", "previous_response_id": first["id"]}
        async with http.post(responses, json=body) as resp:
            assert resp.status == 200
        body["previous_response_id"] = "resp_unknown"
        async with http.post(responses, json=body) as resp:
            assert resp.status == 400
        # backend failures: refused before the stream, and failing inside it
        gw.backend.script(
            [Status(503, {"error": {"message": "overloaded", "code": "overloaded"}})],
            [*text_chunks(["a"]), error_chunk("boom", "engine_dead"), DONE],
        )
        async with http.post(responses, json={"model": "m", "input": "hi"}) as resp:
            assert resp.status == 503
        async with http.post(responses, json={"model": "m", "input": "hi"}) as resp:
            assert orjson.loads(await resp.read())["status"] == "failed"

        samples = await scrape(http, gw)
        requests = "streamer_http_requests_total"
        assert value(samples, requests, method="POST", route="/v1/responses", status="200") == 4
        assert value(samples, requests, method="POST", route="/v1/responses", status="400") == 2
        assert value(samples, requests, method="POST", route="/v1/responses", status="503") == 1
        assert value(samples, requests, method="GET", route="unmatched", status="404") == 1
        sent_sse = sse.count(b"\nevent: ") + sse.startswith(b"event: ")
        assert value(samples, "streamer_events_sent_total", transport="sse") == sent_sse
        assert value(samples, "streamer_events_sent_total", transport="json") >= 6
        assert value(samples, "streamer_time_to_first_event_seconds_count") == 4
        assert value(samples, "streamer_response_duration_seconds_count", status="completed") == 3
        assert value(samples, "streamer_response_duration_seconds_count", status="failed") == 1
        assert value(samples, "streamer_backend_errors_total", kind="overloaded") == 1
        assert value(samples, "streamer_backend_errors_total", kind="engine_dead") == 1
        store = "streamer_store_operations_total"
        assert value(samples, store, operation="put", outcome="ok") == 4
        assert value(samples, store, operation="get", outcome="ok") == 1
        assert value(samples, store, operation="get", outcome="miss") == 1


async def test_metrics_show_active_streams_and_sockets() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:

        async def active(name: str, **labels: str) -> float:
            return value(await scrape(http, gw), name, **labels)

        gw.backend.script([*text_chunks(["a"]), Sleep(30)])
        body = {"model": "m", "input": "hi", "stream": True}
        async with http.post(gw.url + "/responses", json=body) as resp:
            await resp.content.readuntil(b"response.output_text.delta")
            assert await active("streamer_active_streams", transport="sse") == 1
        await until(lambda: _is(active("streamer_active_streams", transport="sse"), 0))
        async with http.ws_connect(gw.ws_url) as ws:
            await until(lambda: _is(active("streamer_active_websockets"), 1))
            await ws.send_str('{"type":"response.create","model":"m","input":"hi"}')
            while orjson.loads((await ws.receive(timeout=10)).data)["type"] != "response.completed":
                pass
        await until(lambda: _is(active("streamer_active_websockets"), 0))
        samples = await scrape(http, gw)
        assert value(samples, "streamer_events_sent_total", transport="websocket") >= 3
        assert value(samples, "streamer_active_streams", transport="websocket") == 0


async def test_memory_is_trimmed_once_the_gateway_is_quiet() -> None:
    """Turns over SSE, JSON and WebSocket all count as running; the trim comes only after
    every one has been over for `--trim-after` seconds."""
    async with GatewayHarness(trim_after=0.2) as gw, aiohttp.ClientSession() as http:
        quiet = gw.gateway.quiet
        gw.backend.script([*text_chunks(["a"]), Sleep(0.5), *TEXT])
        body = {"model": "m", "input": "hi", "stream": True}
        async with http.post(gw.url + "/responses", json=body) as resp:
            await resp.content.readuntil(b"response.output_text.delta")
            assert quiet.running == 1
            await resp.read()
        # the backend's pause outlasted --trim-after, but a turn was running all along
        assert quiet.running == 0 and quiet.trims == 0
        gw.backend.script(TEXT)
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "hi"}) as resp:
            assert resp.status == 200
        async with http.ws_connect(gw.ws_url) as ws:
            gw.backend.script(TEXT)
            await ws.send_str('{"type":"response.create","model":"m","input":"hi"}')
            while orjson.loads((await ws.receive(timeout=10)).data)["type"] != "response.completed":
                pass
            await until(lambda: _true(quiet.trims >= 1))
        assert quiet.running == 0


async def _true(value: bool) -> bool:
    return value


async def _is(awaitable: Any, expected: float) -> bool:
    return await awaitable == expected


async def test_store_errors_are_counted_and_readyz_says_the_store_is_down() -> None:
    closed = refusing_url().split("//")[1].split("/")[0]
    async with GatewayHarness(store=f"redis://{closed}/0") as gw, aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/responses/resp_x") as resp:
            assert resp.status == 503
            assert orjson.loads(await resp.read())["error"]["code"] == "store_unavailable"
        async with http.get(gw.url.removesuffix("/v1") + "/readyz") as resp:
            assert resp.status == 503
            assert orjson.loads(await resp.read()) == {"status": "not ready", "backend": True, "store": False}  # fmt: skip
        samples = await scrape(http, gw)
        store = "streamer_store_operations_total"
        assert value(samples, store, operation="get_response", outcome="error") == 1
        assert value(samples, store, operation="ping", outcome="error") == 1


# -- health --------------------------------------------------------------------------------


async def test_healthz_and_readyz() -> None:
    # no cache: the backend's going away shows at once
    async with GatewayHarness(readyz_cache_seconds=0) as gw, aiohttp.ClientSession() as http:
        root = gw.url.removesuffix("/v1")
        async with http.get(root + "/healthz") as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["status"] == "ok"
        async with http.get(root + "/readyz") as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read()) == {"status": "ready", "backend": True, "store": True}  # fmt: skip
        await gw.backend.stop()  # the backend goes away: still alive, no longer ready
        async with http.get(root + "/healthz") as resp:
            assert resp.status == 200
        async with http.get(root + "/readyz") as resp:
            assert resp.status == 503
            assert orjson.loads(await resp.read())["backend"] is False
        async with http.post(gw.url + "/responses", json={"model": "m", "input": "hi"}) as resp:
            assert resp.status == 502  # said clearly, in OpenAI's shape
            assert orjson.loads(await resp.read())["error"]["code"] == "upstream_unreachable"


# -- request ids ---------------------------------------------------------------------------


async def test_every_answer_carries_a_request_id() -> None:
    async with GatewayHarness() as gw, aiohttp.ClientSession() as http:
        root = gw.url.removesuffix("/v1")
        ids = []
        cases: list[tuple[str, str, Any]] = [
            ("POST", gw.url + "/responses", {"model": "m", "input": "hi"}),
            ("POST", gw.url + "/responses", {"model": "m", "input": "hi", "stream": True}),
            ("POST", gw.url + "/responses", {"model": "m", "input": "hi", "stream": True, "background": True}),
            ("POST", gw.url + "/responses", {"input": "hi"}),
            ("GET", gw.url + "/responses/resp_missing", None),
            ("PUT", gw.url + "/responses", None),
            ("GET", root + "/nope", None),
            ("GET", root + "/healthz", None),
            ("GET", root + "/metrics", None),
        ]  # fmt: skip
        for method, url, body in cases:
            async with http.request(method, url, json=body) as resp:
                await resp.read()
                rid = resp.headers.get("X-Request-Id")
                assert rid and rid.startswith("req_"), (method, url, resp.status)
                ids.append(rid)
        assert len(set(ids)) == len(ids)
        async with http.ws_connect(gw.ws_url) as ws:  # the upgrade's 101 names one too
            upgrade = ws._response  # aiohttp keeps the 101 response only here
            assert upgrade.headers.get("X-Request-Id", "").startswith("req_")
        # a sane client id is kept, so a trace can cross the gateway; anything else is not
        for offered, kept in (
            ("trace-abc_123:4.5", True),
            ("bad id with spaces", False),
            ("a/b", False),
            ("x" * 200, False),
        ):
            async with http.get(root + "/healthz", headers={"X-Request-Id": offered}) as resp:
                assert (resp.headers["X-Request-Id"] == offered) is kept


# -- logs ----------------------------------------------------------------------------------


async def traffic(url: str) -> list[str]:
    """A few ordinary requests (ok, SSE, 400, 404); the request ids they got back."""
    ids = []
    async with aiohttp.ClientSession() as http:
        for method, path, body in [
            ("POST", "/v1/responses", {"model": "m", "input": "hi"}),
            ("POST", "/v1/responses", {"model": "m", "input": "hi", "stream": True}),
            ("POST", "/v1/responses", {"model": "m", "input": 7}),
            ("GET", "/v1/nope", None),
        ]:
            async with http.request(method, url + path, json=body) as resp:
                await resp.read()
                ids.append(resp.headers["X-Request-Id"])
        async with http.get(url + "/healthz", headers={"X-Big": "a" * 9000}) as resp:
            assert resp.status == 400  # a malformed request: the client's fault, not a log flood
    return ids


async def test_logs_hold_only_access_lines_by_default_and_nothing_with_access_log_off(
    tmp_path: Path,
) -> None:
    async with ScriptedBackend() as backend:
        async with gateway_process(tmp_path / "on.log", "--upstream", backend.base_url) as gw:
            await traffic(gw.origin)
            assert await gw.terminate() == 0  # after its exit, its log holds all it wrote
            assert "serving http://127.0.0.1:" in gw.stdout()
            lines = gw.log_lines()
        assert lines and {line["logger"] for line in lines} == {"streamer.access"}, lines
        args = ("--upstream", backend.base_url, "--access-log", "off")
        async with gateway_process(tmp_path / "off.log", *args) as gw:
            await traffic(gw.origin)
            assert await gw.terminate() == 0
            assert gw.stderr().strip() == "", gw.stderr()[-2000:]


async def test_info_logs_one_json_access_line_per_request_with_its_id(tmp_path: Path) -> None:
    async with ScriptedBackend() as backend:
        args = ("--upstream", backend.base_url, "--log-level", "info")
        async with gateway_process(tmp_path / "gateway.log", *args) as gw:
            ids = await traffic(gw.origin)
            assert await gw.terminate() == 0  # after its exit, its log holds all it wrote
            lines = gw.log_lines()  # every line parses as one JSON object
    access = [line for line in lines if line["logger"] == "streamer.access"]
    by_id = {line.get("request_id"): line for line in access}
    for rid, (method, path, status) in zip(
        ids,
        [("POST", "/v1/responses", 200), ("POST", "/v1/responses", 200),
         ("POST", "/v1/responses", 400), ("GET", "/v1/nope", 404)],
        strict=True,
    ):  # fmt: skip
        line = by_id[rid]
        assert (line["method"], line["path"], line["status"]) == (method, path, status)
        assert line["level"] == "info" and isinstance(line["ms"], float) and "ts" in line
    assert not [line for line in lines if line["level"] in ("error", "critical")], lines
    assert not [line for line in lines if "exc" in line], "no tracebacks for ordinary traffic"


# -- settings ------------------------------------------------------------------------------


def test_every_setting_is_a_flag_an_env_var_and_a_row_of_the_settings_page() -> None:
    # not settings: `shared_state_key` is what a --workers supervisor hands its workers
    fields = set(Settings.__dataclass_fields__) - {"extra", "shared_state_key"}
    assert {s.dest for s in SETTINGS} == fields
    page = (REPO / "docs" / "settings.md").read_text()
    for s in SETTINGS:
        assert s.env == "STREAMER_" + s.dest.upper()
        assert s.flag == "--" + s.dest.replace("_", "-") or s.dest == "api_keys"
        assert f"`{s.flag}`" in page and f"`{s.env}`" in page, s.flag
    assert settings_table() in page


async def test_settings_come_from_the_environment_and_flags_win(tmp_path: Path) -> None:
    port = free_port()
    async with ScriptedBackend() as backend:
        env = {
            "STREAMER_UPSTREAM": backend.base_url,
            "STREAMER_PORT": str(port),
            "STREAMER_API_KEYS": "env-key-one,env-key-two",
            "STREAMER_MAX_BODY_BYTES": "400",
            "STREAMER_LOG_LEVEL": "info",
            "STREAMER_MODEL": "env-model",
        }
        gateway = gateway_process(tmp_path / "gateway.log", "--max-body-bytes", "2000", env=env)
        async with gateway as gw:
            assert gw.port == port
            async with aiohttp.ClientSession() as http:
                url = gw.url + "/responses"
                body = {
                    "model": "m",
                    "input": "x" * 700,
                }  # over the env's 400, under the flag's 2000
                async with http.post(url, json=body) as resp:
                    assert resp.status == 401  # STREAMER_API_KEY holds
                for key in ("env-key-one", "env-key-two"):
                    headers = {"Authorization": f"Bearer {key}"}
                    async with http.post(url, json=body, headers=headers) as resp:
                        assert resp.status == 200, await resp.text()
                big = {"model": "m", "input": "x" * 3000}
                async with http.post(url, json=big, headers=headers) as resp:
                    assert resp.status == 413
            assert await gw.terminate() == 0  # after its exit, its log holds all it wrote
            assert any(line["logger"] == "streamer.access" for line in gw.log_lines())
        assert backend.requests[-1]["model"] == "env-model"


def test_environment_defaults_reach_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamer.cli import build_parser
    from streamer.config import settings_from

    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    assert settings_from(build_parser().parse_args(["serve"])) == Settings()
    monkeypatch.setenv("STREAMER_FORWARD_AUTHORIZATION", "true")
    monkeypatch.setenv("STREAMER_IDLE_TIMEOUT", "12.5")
    monkeypatch.setenv("STREAMER_API_KEYS", "a,b")
    parsed = settings_from(build_parser().parse_args(["serve", "--api-key", "c"]))
    assert parsed.forward_authorization is True and parsed.idle_timeout == 12.5
    assert parsed.api_keys == ("c",)  # the flag replaces the environment's list
