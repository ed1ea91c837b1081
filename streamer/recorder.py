"""`--tap-dir`: record each exchange as one JSON-lines file, for `streamer tap` and `replay`.

One file per response: the client's request, the lowered backend request, every raw
chunk the backend sent, and every event sent to the client, each line with a timestamp
(`t`, seconds since the exchange began) and a `kind`. No headers are recorded, so API
keys and `Authorization` values cannot end up here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from streamer.core.events import Event


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
            self._file.write(orjson.dumps(fields) + b"\n")
        except OSError:
            self._file = None  # a full disk must not break the client's stream

    def client_request(self, body: Any) -> None:
        self._line("client_request", body=body)

    def backend_request(self, body: Any) -> None:
        self._line("backend_request", body=body)

    def backend_chunk(self, data: bytes) -> None:
        self._line("backend_chunk", data=data.decode("utf-8", "replace"))

    def client_events(self, events: list[Event]) -> None:
        for event in events:
            self._line("client_event", event=orjson.Fragment(event.data))

    def error(self, status: int, body: Any) -> None:
        self._line("error", status=status, body=body)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TapDirectory:
    """Hands out one recorder per exchange, named by time and response id."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def open(self, response_id: str) -> ExchangeRecorder:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        return ExchangeRecorder(self.directory / f"{stamp}-{response_id}.jsonl")
