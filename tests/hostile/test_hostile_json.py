"""Issue 25, rows 5 and 6: JSON nested deeper than the gateway can serialise, and JSON
that costs far more to parse than to send.

Row 5: orjson parses arrays and objects nested 1,024 deep but serialises only 254, so a
body nested 255-1,023 deep was parsed and then failed wherever the gateway serialised part
of it (the Chat request, the Response's echo, the tap recording): a 500 and a traceback, an
error event with status 500 on the WebSocket, an empty `--tap-dir` recording. Now every
route that parses client JSON refuses a body nested deeper than `MAX_DEPTH` with a 400
naming the path, at parse time; and a body nested exactly `MAX_DEPTH` deep goes through
every route, its recording included (the parser and the serialiser agree).

Row 6: 2.5 KB of zstd decoded to 27 MB of `[{},{},…]`, 9 M dicts: 4.5-7 s of CPU and
~900 MB per request. Now a body past `--max-json-values` values is refused before anything
is parsed; the gateway process's peak RSS and CPU for the attack are printed (`pytest -s`)
and bounded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from builders import GatewayProcess, client_session, gateway_process
from harness import GatewayHarness

from streamer.core.json_bounds import MAX_DEPTH

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd  # type: ignore[import-not-found,no-redef]

MiB = 1 << 20

# Where a client value sits: the raw JSON that opens it inside a create body, the levels
# above the value (the body is one) and the `param` path that names it.
Site = tuple[str, bytes, int, str]
SITES: list[Site] = [
    ("function parameters", b'"tools":[{"type":"function","name":"f","parameters":', 3,
     "tools[0].parameters"),
    ("text.format.schema", b'"text":{"format":{"type":"json_schema","name":"s","schema":', 3,
     "text.format.schema"),
    ("hosted tool field", b'"tools":[{"type":"web_search","filters":', 3, "tools[0].filters"),
    # (an `mcp` tool is no site: the gateway reads it, so a deep field is a 400 naming it)
    ("unknown field", b'"brand_new_field":', 1, "brand_new_field"),
    ("input item", b'"input":[{"type":"message","role":"user","content":"hi","extra":', 3,
     "input[0].extra"),
]  # fmt: skip
SITE_IDS = [site[0] for site in SITES]
DEPTHS = [300, 255, 1023, MAX_DEPTH + 1, 1024, 1025, 5000]  # 255-1,023: a 500 before


def nested(depth: int) -> bytes:
    """JSON of `depth` objects nested in one another (`{"a":{"a":…1…}}`); 0: a number."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def closing(opening: bytes) -> bytes:
    """The brackets that close what `opening` opened, innermost first."""
    opened = [c for c in opening if c in b"[{"]
    return bytes(b"]"[0] if c == b"["[0] else b"}"[0] for c in reversed(opened))


def site_body(site: Site, depth: int, **fields: Any) -> bytes:
    """A create body nested `depth` deep in all, its deepest value at `site`."""
    _, opening, above, _ = site
    base: dict[str, Any] = {"model": "m", "store": False, **fields}
    if not opening.startswith(b'"input"'):
        base["input"] = "hi"
    inner = opening + nested(depth - above) + closing(opening)
    return orjson.dumps(base)[:-1] + b"," + inner + b"}"


def assert_too_deep(status: int, answer: Any, param: str) -> None:
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "json_too_deep" and error["type"] == "invalid_request_error", error
    assert error["param"].startswith(param + "."), error
    assert f"at most {MAX_DEPTH} levels" in error["message"], error


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fails the test if the gateway logged an error (a 500 logs its traceback)."""
    with caplog.at_level(logging.ERROR):
        yield
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def post(url: str, raw: bytes) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with client_session() as session, session.post(url, data=raw, headers=headers) as r:
        data = await r.read()
        return r.status, orjson.loads(data) if r.content_type == "application/json" else data


@pytest.mark.parametrize("fast_http", [True, False], ids=["fast-http", "aiohttp"])
@pytest.mark.parametrize("site", SITES, ids=SITE_IDS)
async def test_too_deep_create_is_a_400_naming_the_path(
    site: Site, fast_http: bool, tmp_path: Path, no_errors_logged: None
) -> None:
    tap = tmp_path / "tap"
    async with GatewayHarness(fast_http=fast_http, tap_dir=str(tap)) as gw:
        for depth in DEPTHS:
            for stream in (False, True):
                status, answer = await post(
                    gw.url + "/responses", site_body(site, depth, stream=stream)
                )
                assert_too_deep(status, answer, site[3])
        assert not gw.backend.requests, "a too-deep body reached the backend"
    assert not tap.exists() or not any(tap.iterdir()), "a refused body left a recording"


async def test_too_deep_input_tokens_and_conversations_are_a_400(no_errors_logged: None) -> None:
    async with GatewayHarness() as gw:
        for depth in DEPTHS:
            status, answer = await post(
                gw.url + "/responses/input_tokens", site_body(SITES[0], depth)
            )
            assert_too_deep(status, answer, "tools[0].parameters")
            item = b'{"items":[{"type":"message","role":"user","content":"hi","extra":'
            raw = item + nested(depth - 3) + b"}]}"
            status, answer = await post(gw.url + "/conversations", raw)
            assert_too_deep(status, answer, "items[0].extra")
            status, created = await post(gw.url + "/conversations", b"{}")
            assert status == 200, created
            status, answer = await post(f"{gw.url}/conversations/{created['id']}/items", raw)
            assert_too_deep(status, answer, "items[0].extra")
            raw = b'{"metadata":{"k":"v"},"extra":' + nested(depth - 1) + b"}"
            status, answer = await post(f"{gw.url}/conversations/{created['id']}", raw)
            assert_too_deep(status, answer, "extra")


async def test_too_deep_websocket_frame_is_an_error_event_with_status_400(
    tmp_path: Path, no_errors_logged: None
) -> None:
    tap = tmp_path / "tap"
    async with GatewayHarness(tap_dir=str(tap)) as gw, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(gw.ws_url, max_msg_size=0)
        for site in SITES:
            for depth in DEPTHS:
                await ws.send_bytes(site_body(site, depth, type="response.create"))
                event = orjson.loads((await ws.receive()).data)
                assert event["type"] == "error" and event["status"] == 400, event
                assert_too_deep(400, event, site[3])
        # the socket still serves a turn afterwards
        await ws.send_str(
            orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}).decode()
        )
        while (event := orjson.loads((await ws.receive()).data))["type"] != "response.completed":
            assert event["type"] != "error", event
        await ws.close()
    assert len(list(tap.iterdir())) == 1, "only the turn that ran is recorded"


# -- the parser and the serialiser agree: MAX_DEPTH goes through everything --------------


@pytest.mark.parametrize("fast_http", [True, False], ids=["fast-http", "aiohttp"])
async def test_a_body_exactly_max_depth_deep_goes_through_every_route(
    fast_http: bool, tmp_path: Path, no_errors_logged: None
) -> None:
    """Each site at exactly MAX_DEPTH: streamed, whole, in the background (the store holds
    its events), over the WebSocket, recorded under `--tap-dir`, counted by input_tokens,
    kept as a conversation item. Every answer is a 200 and every recording line parses."""
    tap = tmp_path / "tap"
    async with GatewayHarness(fast_http=fast_http, tap_dir=str(tap)) as gw:
        for site in SITES:
            for fields in ({}, {"stream": True}, {"background": True, "store": True}):
                status, answer = await post(
                    gw.url + "/responses", site_body(site, MAX_DEPTH, **fields)
                )
                assert status == 200, (site[0], fields, answer)
            status, answer = await post(
                gw.url + "/responses/input_tokens", site_body(site, MAX_DEPTH)
            )
            assert status == 200, (site[0], answer)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(gw.ws_url, max_msg_size=0)
            await ws.send_bytes(site_body(SITES[0], MAX_DEPTH, type="response.create"))
            while (event := orjson.loads((await ws.receive()).data))[
                "type"
            ] != "response.completed":
                assert event["type"] != "error", event
            await ws.close()
        item = b'{"items":[{"type":"message","role":"user","content":"hi","extra":'
        status, answer = await post(
            gw.url + "/conversations", item + nested(MAX_DEPTH - 3) + b"}]}"
        )
        assert status == 200, answer
        async with client_session() as session:
            listed = await session.get(f"{gw.url}/conversations/{answer['id']}/items")
            assert listed.status == 200, await listed.text()
    recordings = list(tap.iterdir())
    assert recordings
    for path in recordings:
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert [line["kind"] for line in lines[:2]] == ["client_request", "backend_request"], path


# -- row 6: a small compressed body that decodes to costly JSON ----------------------------


def peak_rss(gateway: GatewayProcess) -> int:
    """Peak resident memory of the gateway process so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def costly_bodies() -> dict[str, bytes]:
    """Bodies of ~27 MB decoded (under the 32 MiB body limit) that are cheap to send and
    costly to build: 9 M empty objects (the issue's), 9 M numbers, 6.75 M strings, all in
    a create body so that nothing but the value count refuses them."""
    head, tail = b'{"model":"m","input":"hi","pad":[', b"0]}"
    return {
        "objects": head + b"{}," * 9_000_000 + tail,
        "floats": head + b"1.5," * 6_750_000 + tail,
        "strings": head + b'"a",' * 6_750_000 + tail,
    }


@pytest.mark.parametrize("kind", ["objects", "floats", "strings"])
async def test_a_zstd_body_of_cheap_values_is_refused_before_it_is_parsed(
    kind: str, tmp_path: Path
) -> None:
    raw = costly_bodies()[kind]
    packed = zstd.compress(raw)
    assert len(packed) < 4096 and len(raw) < 32 * MiB
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    async with gateway_process(tmp_path / "gw.log") as gateway:
        rss_before = peak_rss(gateway)
        cpu_before = cpu_seconds(gateway.process.pid)
        async with client_session() as session, asyncio.timeout(120):
            for _ in range(3):
                async with session.post(
                    gateway.url + "/responses", data=packed, headers=headers
                ) as resp:
                    answer = await resp.json()
                    assert resp.status == 400, answer
                    assert answer["error"]["code"] == "too_many_json_values", answer
            async with session.post(
                gateway.url + "/responses", json={"model": "m", "input": "hi"}
            ) as resp:
                assert resp.status == 200, await resp.text()
        cpu = (cpu_seconds(gateway.process.pid) - cpu_before) / 3
        peak = peak_rss(gateway)
    print(
        f"\n{kind}: {len(packed):,} B of zstd -> {len(raw) / MiB:.0f} MiB: peak RSS "
        f"{rss_before / MiB:.0f} -> {peak / MiB:.0f} MiB, {cpu:.2f} s CPU a request"
    )
    # the decoded body and a few passes over it; a parse would hold 20-30x the body
    assert peak - rss_before < 6 * len(raw), f"peak RSS grew {(peak - rss_before) / MiB:.0f} MiB"
