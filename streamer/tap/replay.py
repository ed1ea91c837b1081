"""`streamer replay FILE`: a recorded backend stream through today's pipeline.

A `serve --tap-dir` recording holds the client's request and the raw bytes the backend
sent. Replaying runs the gateway's own path over them: `stream_events` with a `BackendStream`
that reads the recorded reads (the same decoder, batches and end of stream), then prints
and checks the events, and with `--compare` diffs them against the events the gateway sent
when it was recorded, so a recorded misbehaviour becomes a regression test.

A recording does not say how the body ended: it ends as a body read to its end does.
A recording of a Responses backend (`--upstream-api responses`: its backend request has an
`input`, not `messages`) is read with that API's stream and lowering.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TextIO

import orjson

from streamer.core.errors import RequestError
from streamer.core.events import Event
from streamer.core.sealing import load_sealer
from streamer.core.tools import NamingConfig
from streamer.tap.command import EXIT_CLEAN, EXIT_UNREADABLE, EXIT_VIOLATIONS, use_color
from streamer.tap.grammar import GrammarChecker
from streamer.tap.render import Renderer
from streamer.turns.recorder import chunk_bytes
from streamer.turns.turn import TurnOptions, prepare
from streamer.turns.turn_runner import stream_events
from streamer.upstream.backend_stream import BackendStream
from streamer.upstream.chat.kind import CHAT
from streamer.upstream.kind import BackendKind
from streamer.upstream.kinds import recorded_kind


class Recording:
    """The parts of one recorded exchange that a replay needs."""

    def __init__(self, lines: Iterable[dict[str, Any]]) -> None:
        self.request: dict[str, Any] | None = None
        self.owner = ""  # whose request (its key's digest): sealed items open for it only
        self.backend_request: Any = None
        self.chunks: list[bytes] = []
        self.events: list[dict[str, Any]] = []
        for line in lines:
            kind = line.get("kind")
            if kind == "client_request" and self.request is None:
                self.request = line.get("body")
                self.owner = str(line.get("owner") or "")
            elif kind == "backend_request" and self.backend_request is None:
                self.backend_request = line.get("body")
            elif kind == "backend_chunk":
                self.chunks.append(chunk_bytes(line))
            elif kind == "client_event":
                self.events.append(line["event"])

    @property
    def kind(self) -> BackendKind:
        """The kind of backend recorded, as the request it was sent says (its row's
        `recorded`: a Responses backend's has an `input` and no `messages`)."""
        return recorded_kind(self.backend_request)

    @classmethod
    def load(cls, path: str) -> Recording:
        with open(path, "rb") as f:
            return cls(orjson.loads(raw) for raw in f if raw.strip())


class _RecordedBody:
    """The recorded reads as a response body that has them all (no read waits)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = deque(chunks)

    @property
    def buffered(self) -> bool:
        return bool(self._chunks)

    @property
    def complete(self) -> bool:
        return not self._chunks

    async def read(self) -> bytes:
        return self._chunks.popleft() if self._chunks else b""

    def release(self) -> None:
        self._chunks.clear()

    abort = release


class _RecordedUpstream:
    """An upstream that answers with a recording's backend bytes."""

    def __init__(self, chunks: list[bytes], kind: BackendKind = CHAT) -> None:
        self.chunks = chunks
        self.kind = kind  # whose stream and whole-JSON decoders read the bytes

    async def open(self, backend_request: dict[str, Any], **_: Any) -> Any:
        body = b"".join(self.chunks)
        if body.lstrip()[:1] in (b"{", b"["):  # a whole JSON answer, recorded as one read
            return BackendStream.answered(self.kind.decode_whole(body, ()))
        decoder = self.kind.decoder(300, None, ())
        return await BackendStream.reading(_RecordedBody(self.chunks), decoder)  # type: ignore[arg-type]


async def replay(recording: Recording, options: TurnOptions | None = None) -> list[Event]:
    """The events today's pipeline makes from the recorded request and backend bytes."""
    if recording.request is None:
        raise ValueError("the recording has no client_request line")
    options = options or TurnOptions()
    kind = recording.kind
    if kind is not options.kind:  # lowered for it, with the generic profile's tool forms
        lowering = replace(options.lowering, tools=kind.tools("generic"))
        options = replace(options, kind=kind, lowering=lowering)
    turn = prepare(dict(recording.request), options, client=recording.owner)
    events: list[Event] = []
    if recording.events and recording.events[0].get("type") == "response.queued":
        events += turn.streamer.queued()  # a background turn's recording: its log, queued first
    upstream = _RecordedUpstream(recording.chunks, kind)
    async for batch in stream_events(turn, upstream):
        events += batch
    return events


def normalised(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with generated ids and timestamps replaced by stable placeholders."""
    ids: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key in ("id", "item_id", "call_id") and isinstance(item, str):
                    item = ids.setdefault(item, f"<id{len(ids)}>")
                elif key in ("created_at", "completed_at") and item is not None:
                    item = 0
                elif key == "encrypted_content" and isinstance(item, str):
                    item = "<sealed>"  # a fresh nonce every time (streamer/core/sealing.py)
                out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return [walk(e) for e in events]


def add_replay_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "replay", help="run a recorded backend stream through today's pipeline",
        description=__doc__.splitlines()[0], allow_abbrev=False,
    )  # fmt: skip
    parser.add_argument("file", metavar="FILE", help="a `serve --tap-dir` recording")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="exit 1 unless the events equal the recorded ones (ids aside)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--tool-name-style", default="codex")
    parser.add_argument("--max-tool-name-length", type=int, default=64)
    parser.add_argument(
        "--state-key-file", help="the recording gateway's, to open sealed items in its request"
    )
    return parser


async def run_replay(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        recording = Recording.load(args.file)
        options = TurnOptions(
            naming=NamingConfig(
                style=args.tool_name_style, max_name_length=args.max_tool_name_length
            ),
            sealer=load_sealer(args.state_key_file),
        )
        events = [orjson.loads(e.data) for e in await replay(recording, options)]
    except (OSError, ValueError, RequestError, orjson.JSONDecodeError) as exc:
        print(f"streamer replay: {args.file}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    checker = GrammarChecker(None)
    renderer = Renderer(out, mode="json" if args.json else "timeline",
                        color=use_color(args.color, out))  # fmt: skip
    for position, event in enumerate(events):
        renderer.event(position, 0.0, event, checker.feed(event))
    renderer.end(checker.finish(), source_format="replay", note=None)
    status = EXIT_VIOLATIONS if renderer.summary.violations else EXIT_CLEAN
    if args.compare:
        if normalised(events) != normalised(recording.events):
            print("streamer replay: the events differ from the recorded ones", file=sys.stderr)
            return EXIT_VIOLATIONS
        print("streamer replay: same events as recorded", file=sys.stderr)
    return status
