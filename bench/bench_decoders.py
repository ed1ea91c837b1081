"""Each backend kind's stream decoder over the load backend's own stream, per event.

The same turn (N text deltas, a call with M argument fragments) as `load_backend.py` streams
it in Chat chunks, Responses events and Anthropic Messages events, fed to `ChatDecoder`,
`ResponsesDecoder` and `MessagesDecoder` in reads of `--read` bytes, and the Messages
decoder again on its plain path (no learnt shapes: every event parsed whole). Thread CPU
time per event, the median over the repeats, every decoder interleaved in the same run.

    python bench/bench_decoders.py [--n 2000] [--m 50] [--repeat 50] [--read 65536]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load_backend
import load_messages
import load_responses
import orjson

from streamer.upstream.anthropic.decoder import MessagesEventDecoder
from streamer.upstream.anthropic.stream import MessagesDecoder
from streamer.upstream.chat.stream import ChatDecoder, EndCause
from streamer.upstream.responses.decoder import ResponsesDecoder

clock = time.thread_time_ns
FLAT = "mcp__bench__lookup"


class PlainMessagesDecoder(MessagesDecoder):
    __slots__ = ()

    def _payloads(self) -> MessagesEventDecoder:
        return MessagesEventDecoder(lessons=0)


def _events(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def streams(n: int, m: int) -> dict[str, tuple[Callable[[], Any], bytes]]:
    chat = b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n" for c in load_backend.chat_chunks(n, m, FLAT)
    )
    responses = _events(load_responses.responses_events(n, m, FLAT, None))
    messages = _events(load_messages.message_events(n, m, FLAT))
    return {
        "chat": (ChatDecoder, chat + b"data: [DONE]\n\n"),
        "responses": (ResponsesDecoder, responses),
        "messages": (MessagesDecoder, messages),
        "messages (plain)": (PlainMessagesDecoder, messages),
    }


def once(make: Callable[[], Any], raw: bytes, read: int) -> int:
    t0 = clock()
    decoder = make()
    for at in range(0, len(raw), read):
        decoder.feed(raw[at : at + read])
        while decoder.pending:
            decoder.take()
    decoder.end(EndCause.CLEAN)
    return clock() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--m", type=int, default=50)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--read", type=int, default=64 * 1024)
    args = p.parse_args(argv)
    table = streams(args.n, args.m)
    times: dict[str, list[int]] = {name: [] for name in table}
    for _ in range(args.repeat):
        for name, (make, raw) in table.items():
            times[name].append(once(make, raw, args.read))
    events = args.n + args.m
    for name, samples in times.items():
        print(f"{name:<18} {statistics.median(samples) / events / 1000:6.3f} us/event")


if __name__ == "__main__":
    main()
