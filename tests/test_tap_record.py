"""`serve --tap-dir` recordings: checked by the tap, replayed through today's pipeline."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI
from test_gateway_sdk import SCENARIOS, TOOLS

from streamer.cli import build_parser
from streamer.tap.command import run_tap
from streamer.tap.replay import Recording, normalised, replay, run_replay

SECRET = "sk-planted-upstream-secret-0123456789"


async def record(tmp_path: Path, script: list[Any], *, stream: bool = True) -> Path:
    """Run one scripted turn through a recording gateway; return its recording."""
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(tap_dir=str(tap_dir), upstream_api_key=SECRET) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="client-key", max_retries=0) as client,
    ):
        gw.backend.script(script)
        result = await client.responses.create(
            model="m",
            input="hi",
            tools=TOOLS,
            store=False,
            stream=stream,  # type: ignore[arg-type]
        )
        if stream:
            async for _ in result:  # type: ignore[union-attr]
                pass
        assert gw.backend.records[-1].headers["Authorization"] == f"Bearer {SECRET}"
    (path,) = tap_dir.iterdir()
    return path


async def tap(path: Path, *extra: str) -> tuple[int, str]:
    args = build_parser().parse_args(["tap", str(path), "--color", "never", *extra])
    out = io.StringIO()
    return await run_tap(args, out), out.getvalue()


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_recorded_exchange_is_clean_and_replays_the_same(
    scenario: str, tmp_path: Path
) -> None:
    path = await record(tmp_path, SCENARIOS[scenario][0])
    text = path.read_text()
    kinds = [orjson.loads(line)["kind"] for line in text.splitlines()]
    assert kinds[:2] == ["client_request", "backend_request"]
    assert "backend_chunk" in kinds and "client_event" in kinds
    assert SECRET not in text and "Authorization" not in text and "client-key" not in text

    status, output = await tap(path)  # the gateway's own stream passes the grammar check
    assert status == 0, output
    recording = Recording.load(str(path))
    replayed = [orjson.loads(e.data) for e in await replay(recording)]
    assert normalised(replayed) == normalised(recording.events)

    args = build_parser().parse_args(["replay", str(path), "--compare", "--color", "never"])
    assert await run_replay(args, io.StringIO()) == 0


async def test_non_streaming_exchange_is_recorded_too(tmp_path: Path) -> None:
    path = await record(tmp_path, SCENARIOS["namespaced_call"][0], stream=False)
    recording = Recording.load(str(path))
    assert recording.events[-1]["type"] == "response.completed"
    call = recording.events[-1]["response"]["output"][0]
    assert (call["namespace"], call["name"]) == ("mcp__docs", "search")


async def test_broken_recording_is_reported(tmp_path: Path) -> None:
    path = await record(tmp_path, SCENARIOS["namespaced_call"][0])
    lines = path.read_text().splitlines()
    # Drop the call's output_item.done: the item is never finished and the output differs.
    broken = [
        line for line in lines
        if '"response.output_item.done"' not in line
    ]  # fmt: skip
    broken_path = tmp_path / "broken.jsonl"
    broken_path.write_text("\n".join(broken) + "\n")
    status, output = await tap(broken_path, "--json")
    assert status == 1
    rules = {
        v["rule"] for line in output.splitlines() for v in orjson.loads(line).get("violations", [])
    }
    assert rules  # the violation names the broken rule
    args = build_parser().parse_args(["replay", str(broken_path), "--compare"])
    assert await run_replay(args, io.StringIO()) == 1  # today's pipeline differs from it
