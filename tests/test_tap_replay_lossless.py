"""Recordings are lossless: a replay runs the gateway's own path over the recorded bytes and
makes the events the client was sent, even when a backend read ends inside a character."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
from scripted_backend import DONE, finish, text_chunks
from test_tap_record import record

from streamer.cli import build_parser
from streamer.tap.replay import Recording, normalised, replay, run_replay
from streamer.turns.recorder import ExchangeRecorder, chunk_bytes

TEXT = ["h\u00e9", "llo \u2603 ", "\U0001f600!"]  # two-, three- and four-byte characters


def encoded(events: list[dict[str, object]]) -> list[bytes]:
    """The events' bytes, generated ids and times made stable."""
    return [orjson.dumps(e) for e in normalised(events)]


async def test_replay_equals_the_live_run_byte_for_byte(tmp_path: Path) -> None:
    path = await record(tmp_path, [*text_chunks(TEXT), finish("stop"), DONE])
    recording = Recording.load(str(path))
    replayed = [orjson.loads(e.data) for e in await replay(recording)]
    assert encoded(replayed) == encoded(recording.events)
    assert recording.events[-1]["type"] == "response.completed"


def split_everywhere(path: Path, out: Path) -> bytes:
    """`path` with its backend bytes re-recorded one byte per read (every character split)."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    body = b"".join(chunk_bytes(line) for line in lines if line["kind"] == "backend_chunk")
    recorder = ExchangeRecorder(out)
    for line in lines:
        if line["kind"] == "backend_chunk":
            continue
        if line["kind"] == "client_event":
            for i in range(len(body)):
                recorder.backend_chunk(body[i : i + 1])
            body = b""
        recorder._line(line.pop("kind"), **{k: v for k, v in line.items() if k != "t"})
    recorder.close()
    return out.read_bytes()


async def test_a_read_that_splits_a_character_replays_identically(tmp_path: Path) -> None:
    path = await record(tmp_path, [*text_chunks(TEXT), finish("stop"), DONE])
    split = tmp_path / "split.jsonl"
    raw = split_everywhere(path, split)
    assert b'"encoding":"base64"' in raw  # a lone byte of a character is not text
    recording = Recording.load(str(split))
    whole = b"".join(recording.chunks)
    # the bytes come back exactly: the characters whole once joined, never U+FFFD
    assert "\u00e9".encode() in whole and "\U0001f600".encode() in whole
    assert "\ufffd".encode() not in whole
    replayed = [orjson.loads(e.data) for e in await replay(recording)]
    assert encoded(replayed) == encoded(recording.events)
    text = "".join(e["delta"] for e in replayed if e["type"] == "response.output_text.delta")
    assert text == "".join(TEXT)
    args = build_parser().parse_args(["replay", str(split), "--compare", "--color", "never"])
    assert await run_replay(args, io.StringIO()) == 0


def test_old_recordings_with_text_data_stay_readable() -> None:
    assert chunk_bytes({"kind": "backend_chunk", "data": "data: h\u00e9\n\n"}) == (
        "data: h\u00e9\n\n".encode()
    )
    assert chunk_bytes({"kind": "backend_chunk", "encoding": "base64", "data": "w6k="}) == (
        "\u00e9".encode()
    )
