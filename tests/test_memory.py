"""What a gateway keeps in memory (issue 20: peak RSS under 64 MB at c = 64, fresh process).

- `streamer serve` starts without the modules a plain turn never needs: the other
  commands (tap with its WebSocket client, codex) and `cryptography` (~8 MB, imported when
  something is first sealed or opened);
- a finished turn is freed by reference counting alone, with no cycle left for the
  collector (64 streams' worth of dead turns piled up between collections);
- while a stream waits for its next backend read it holds neither the deltas it has spent
  nor the events it has sent.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
from test_gateway_run import a_turn, gateway
from test_pipeline_first_batch import ListStream, ListUpstream

from streamer.cli import main
from streamer.core.batch import Batch
from streamer.core.deltas import Finish, TextDelta
from streamer.core.events import Event
from streamer.core.sealing import Sealer

ROOT = Path(__file__).resolve().parent.parent

STARTUP = """
import asyncio, sys
from aiohttp import web
from streamer.cli import build_parser
from streamer.config import settings_from
from streamer.app import check_settings, create_app

async def main() -> None:
    args = build_parser("serve").parse_args(["serve", "--upstream", "http://127.0.0.1:9/v1"])
    settings = settings_from(args)
    check_settings(settings)
    runner = web.AppRunner(create_app(settings))
    await runner.setup()  # the app's startup: the gateway, the registry, the store
    try:
        print("\\n".join(sorted(sys.modules)))
    finally:
        await runner.cleanup()

asyncio.run(main())
"""


def test_serve_starts_without_the_other_commands_nor_cryptography_nor_mcp() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", STARTUP], capture_output=True, env=env, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    modules = out.stdout.decode().split()
    assert "streamer.turns.gateway" in modules and "streamer.frontends.http" in modules
    unwanted = ("cryptography", "streamer.tap", "streamer.codex_launch", "websockets")
    # remote MCP: the SDK and its HTTP stack come with the first MCP turn (~6 MB idle RSS)
    unwanted += ("mcp", "httpx2", "httpcore2", "anyio", "opentelemetry")
    assert [m for m in modules if m.startswith(unwanted)] == []


def test_serve_alone_still_checks_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--no-such-flag"])
    assert exit_.value.code == 2
    # the usage line names every command, as with the whole command line
    assert "usage: streamer [-h] [--version] {serve,codex,tap,replay}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--port", "many"])
    assert "usage: streamer serve" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])  # the whole command line: every command listed
    listed = capsys.readouterr().out
    assert all(f"    {c} " in listed for c in ("serve", "codex", "tap", "replay"))


def test_a_sealer_opens_what_it_sealed_with_cryptography_loaded_on_first_use() -> None:
    sealer = Sealer.from_secret(b"k" * 32)
    blob = sealer.seal("compaction", "summary", "s")
    assert Sealer.from_secret(b"k" * 32).open("compaction", "summary", blob, "input[0]") == "s"


async def test_a_finished_turn_is_freed_without_the_collector() -> None:
    deltas = [[TextDelta("a")], [TextDelta("b")], [Finish("stop")]]
    gw, _ = gateway(ListUpstream(ListStream(deltas, ready=False, end_with_last=False)))
    turn = await a_turn(gw, store=False)
    streamer = weakref.ref(turn.streamer)

    class Sink:
        answered = True

        async def send(self, batch: list[Event], final: bool) -> None:
            pass

    gc.collect()
    gc.disable()
    try:
        await gw.run(turn, Sink(), "sse")
        assert turn.streamer.done
        del turn
        assert streamer() is None  # no reference cycle: gone with its last reference
    finally:
        gc.enable()


class WatchedStream(ListStream):
    """Waits before each read after the first (as on a backend's next bytes) until told
    to go on; meanwhile the test looks at what still refers to the batch it gave last and
    to the events the sink was sent last."""

    def __init__(self, sent: list[list[Event]], **kw: Any) -> None:
        super().__init__(**kw)
        self.sent = sent
        self.given: list[Batch] = []
        self.waiting, self.go = asyncio.Event(), asyncio.Event()

    async def __anext__(self) -> Batch:
        if self.given:
            self.waiting.set()
            await self.go.wait()
            self.go.clear()
        batch = await super().__anext__()
        self.given.append(batch)
        return batch


async def holders_at_each_wait(stream: WatchedStream, run: asyncio.Task[None]) -> list[list[str]]:
    """For each wait of the stream: the types of what holds its last batch or last events
    (the stream's and the sink's own records aside)."""
    held: list[list[str]] = []
    while True:
        waiting = asyncio.ensure_future(stream.waiting.wait())
        await asyncio.wait([waiting, run], return_when=asyncio.FIRST_COMPLETED)
        if not stream.waiting.is_set():
            waiting.cancel()
            return held
        stream.waiting.clear()
        mine = (stream.given, stream.sent, stream.batches)
        holders = gc.get_referrers(stream.given[-1], stream.sent[-1])
        held.append([type(h).__name__ for h in holders if not any(h is m for m in mine)])
        stream.go.set()


async def test_a_waiting_stream_holds_neither_its_spent_deltas_nor_its_sent_events() -> None:
    sent: list[list[Event]] = []
    deltas = [[TextDelta("a")], [TextDelta("b")], [TextDelta("c")], [Finish("stop")]]
    stream = WatchedStream(sent, batches=deltas, ready=False, end_with_last=False)
    gw, _ = gateway(ListUpstream(stream))
    turn = await a_turn(gw, store=False)

    class Sink:
        answered = True

        async def send(self, batch: list[Event], final: bool) -> None:
            sent.append(batch)

    run = asyncio.ensure_future(gw.run(turn, Sink(), "sse"))
    held = await holders_at_each_wait(stream, run)
    await run
    assert held == [[], [], [], []]  # before reads 2, 3, 4 and the one that ends it
