"""`--tap-dir`: record each exchange as one JSON-lines file, for `streamer tap` and `replay`.

One file per response: the client's request, the lowered backend request, every raw
chunk the backend sent, and every event sent to the client, each line with a timestamp
(`t`, seconds since the exchange began) and a `kind`; an `error` line when the client was
answered with an error instead, an `abandoned` line when the client left mid-turn. No headers are recorded, so API
keys and `Authorization` values cannot end up here.

Backend chunks are recorded exactly: `data` is the read as text when it is valid UTF-8,
else its base64 with `"encoding": "base64"` (a read may end inside a character; decoding it
leniently would record U+FFFD, and a replay would then differ from what happened).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from streamer.core.events import Event
from streamer.core.mcp_servers import public_tools


class ExchangeRecorder:
    """Writes one exchange; every method is cheap and never raises into the turn."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = open(path, "ab")  # noqa: SIM115 - closed in close()
        self._start = time.monotonic()

    def _line(self, kind: str, **fields: Any) -> None:
        if self._file is None:
            return
        fields["t"] = round(time.monotonic() - self._start, 6)
        fields["kind"] = kind
        try:
            line = orjson.dumps(fields)
        except orjson.JSONEncodeError as exc:  # nested too deep for the serialiser, say
            line = orjson.dumps({"t": fields["t"], "kind": kind, "unrecorded": str(exc)})
        try:
            self._file.write(line + b"\n")
        except OSError:
            self._file = None  # a full disk must not break the client's stream

    def client_request(self, body: Any, owner: str = "") -> None:
        """The request; `owner`: the digest of the client's key (a replay opens its sealed
        items as that client), left out for the anonymous client."""
        body = _public(body)
        if owner:
            self._line("client_request", body=body, owner=owner)
        else:
            self._line("client_request", body=body)

    def backend_request(self, body: Any) -> None:
        self._line("backend_request", body=_public(body))

    def backend_chunk(self, data: bytes) -> None:
        try:
            self._line("backend_chunk", data=data.decode())
        except UnicodeDecodeError:  # cut inside a character, or not text at all
            self._line("backend_chunk", encoding="base64", data=base64.b64encode(data).decode())

    def client_events(self, events: list[Event]) -> None:
        for event in events:
            self._line("client_event", event=orjson.Fragment(event.data))

    def error(self, status: int, body: Any) -> None:
        self._line("error", status=status, body=body)

    def abandoned(self) -> None:
        """The turn ended before its terminal event with no error answered: the client left."""
        self._line("abandoned")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def chunk_bytes(line: dict[str, Any]) -> bytes:
    """The bytes of a `backend_chunk` line, as the backend sent them (older recordings: the
    text they hold, which was decoded leniently)."""
    data = line.get("data", "")
    if not isinstance(data, str):
        raise ValueError("a backend_chunk line without a data string")
    if line.get("encoding") == "base64":
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error:
            raise ValueError("a backend_chunk line whose base64 is broken") from None
    return data.encode()


class TapDirectory:
    """Hands out one recorder per exchange, named by time and response id."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def open(self, response_id: str) -> ExchangeRecorder:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        return ExchangeRecorder(self.directory / f"{stamp}-{response_id}.jsonl")


def _public(body: Any) -> Any:
    """A request as recorded: its `mcp` tools without their headers (a backend that runs
    MCP itself is sent them; a recording never holds them)."""
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list):
        return body
    return {**body, "tools": public_tools(tools)}
