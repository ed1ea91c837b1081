"""Every `--tap-dir` recording the gateway writes passes its own checker (`streamer tap`).

One gateway records a turn of each kind a client can get: streaming, plain JSON, WebSocket,
failed mid-stream, incomplete, background (its log starts with `response.queued`) and a
cancelled background turn (its log ends with the cancel's `response.failed`).
"""

from __future__ import annotations

import io
from pathlib import Path

import orjson
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, HANG, error_chunk, finish, text_chunks, usage

from streamer.cli import build_parser
from streamer.tap.command import run_tap
from streamer.tap.replay import Recording, normalised, replay

END = [finish("stop"), usage(3, 2), DONE]


async def checked(path: Path) -> tuple[int, str]:
    args = build_parser().parse_args(["tap", str(path), "--color", "never"])
    out = io.StringIO()
    return await run_tap(args, out), out.getvalue()


def events(path: Path) -> list[str]:
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    return [line["event"]["type"] for line in lines if line["kind"] == "client_event"]


async def record_every_kind(gw: GatewayHarness, client: AsyncOpenAI) -> dict[str, str]:
    """Run one turn of each kind; their response ids by kind."""
    ids: dict[str, str] = {}
    gw.backend.script([*text_chunks(["Hel", "lo"]), *END])
    async with await client.responses.create(model="m", input="hi", stream=True) as stream:
        ids["streaming"] = [e async for e in stream][-1].response.id  # type: ignore[union-attr]
    gw.backend.script([*text_chunks(["ok"]), *END])
    ids["json"] = (await client.responses.create(model="m", input="hi")).id
    gw.backend.script([*text_chunks(["part"]), error_chunk("boom"), DONE])
    ids["failed"] = (await client.responses.create(model="m", input="hi")).id
    gw.backend.script([*text_chunks(["cut"]), finish("length"), DONE])
    ids["incomplete"] = (await client.responses.create(model="m", input="hi")).id
    gw.backend.script([*text_chunks(["ws"]), *END])
    async with client.responses.connect() as conn:
        await conn.response.create(model="m", input="hi")
        async for event in conn:
            if event.type == "response.completed":
                ids["websocket"] = event.response.id
                break
    gw.backend.script([*text_chunks(["late"]), *END])
    background = await client.responses.create(model="m", input="hi", background=True)
    ids["background"] = background.id
    async with await client.responses.retrieve(background.id, stream=True) as follow:
        assert [e async for e in follow][-1].type == "response.completed"
    gw.backend.script([*text_chunks(["partial"]), HANG])
    running = await client.responses.create(model="m", input="hi", background=True)
    async with await client.responses.retrieve(running.id, stream=True) as follow:
        async for event in follow:  # the turn is streaming: the backend answered
            if event.type == "response.output_text.delta":
                break
    assert (await client.responses.cancel(running.id)).status == "cancelled"
    ids["cancelled"] = running.id
    return ids


async def test_every_recording_passes_the_tap_checker(tmp_path: Path) -> None:
    tap_dir = tmp_path / "tap"
    async with (
        GatewayHarness(tap_dir=str(tap_dir)) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as client,
    ):
        ids = await record_every_kind(gw, client)
    # the harness has stopped: every turn, the background ones included, closed its file
    files = {path.name.split("-", 1)[1].removesuffix(".jsonl"): path for path in tap_dir.iterdir()}
    assert set(ids.values()) <= set(files)
    for kind, response_id in ids.items():
        status, output = await checked(files[response_id])
        assert status == 0, f"{kind}: {output}"
    background = events(files[ids["background"]])
    assert background[:3] == ["response.queued", "response.created", "response.in_progress"]
    assert background[-1] == "response.completed"
    cancelled = events(files[ids["cancelled"]])
    assert cancelled[0] == "response.queued" and cancelled[-1] == "response.failed"
    assert events(files[ids["failed"]])[-1] == "response.failed"
    assert events(files[ids["incomplete"]])[-1] == "response.incomplete"
    # and replays as it was recorded, response.queued included
    recording = Recording.load(str(files[ids["background"]]))
    replayed = [orjson.loads(e.data) for e in await replay(recording)]
    assert normalised(replayed) == normalised(recording.events)
