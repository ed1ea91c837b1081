"""The pure per-request pipeline over the bench's own backend stream, stage by stage.

One response as `load_backend.py` sends it (a role chunk, N text deltas, a call with M
argument fragments, finish, usage, [DONE]; one HTTP chunk per SSE event), cut into reads of
`--read` bytes, goes through what the gateway runs per request without I/O: `prepare`, then
per read `ChunkedDecoder.feed`, `ChatDecoder.feed`/`take` (SSE and Chat decoding), the
streamer's `feed` and `sse.encode_many`, then `finish`. CPU time (the thread's) per stage,
per request and per event, the median over the repeats; `total` is the median of the sums,
so it also carries the garbage collector's pauses, which land in one stage or another.

`--plain` is every speed switch off (`--reference all`, streamer/core/speed.py: the plain
equivalent of each stage's trick); by default both are timed, interleaved, in the same run,
and `fast/plain` is their ratio: what the tricks buy, per event.

    python bench/bench_pipeline.py [--n 1 200 2000] [--m 50] [--repeat 300] [--plain|--fast]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load_backend
import load_client

from streamer.core import speed, sse
from streamer.turns.turn import TurnOptions, prepare
from streamer.upstream.chat.stream import ChatDecoder, EndCause
from streamer.upstream.http1.wire import ChunkedDecoder

STAGES = ("prepare", "chunked", "decode", "streamer", "encode")
# CPU time of this thread: the machine is shared, and time spent descheduled is not ours.
clock = time.thread_time_ns


def reads_of(n: int, m: int, size: int) -> list[bytes]:
    raw = load_backend.encode_stream(n, m, "mcp__bench__lookup")
    body = raw[raw.index(b"\r\n\r\n") + 4 :]
    return [body[i : i + size] for i in range(0, len(body), size)]


def one(reads: list[bytes], options: TurnOptions) -> tuple[list[int], int]:
    """One request through the pipeline: ns per stage, and the events it made."""
    body: dict[str, Any] = {"model": "bench", "stream": True, "input": "hi"}
    body["tools"] = load_client.TOOLS
    t = [0] * len(STAGES)
    a = clock()
    turn = prepare(body, options)
    streamer = turn.streamer
    chunked, decoder = ChunkedDecoder(), ChatDecoder(300)
    events = streamer.start()
    b = clock()
    t[0] += b - a
    n = len(events)
    out = [sse.encode_many(events)]
    for data in reads:
        a = clock()
        payload = chunked.feed(data)
        b = clock()
        deltas = decoder.feed(payload)
        c = clock()
        t[1] += b - a
        t[2] += c - b
        while True:
            a = clock()
            events = streamer.feed(deltas)
            b = clock()
            out.append(sse.encode_many(events))
            c = clock()
            t[3] += b - a
            t[4] += c - b
            n += len(events)
            if not decoder.pending:
                break
            a = clock()
            deltas = decoder.take()
            t[2] += clock() - a
    a = clock()
    deltas = decoder.end(EndCause.CLEAN)
    b = clock()
    events = streamer.feed(deltas) + streamer.finish()
    c = clock()
    out.append(sse.encode_many(events))
    d = clock()
    t[2] += b - a
    t[3] += c - b
    t[4] += d - c
    return t, n + len(events)


def set_fast(fast: bool) -> None:
    speed.use_reference("" if fast else "all")


def measure(n: int, m: int, size: int, repeat: int, modes: list[bool]) -> dict[bool, Any]:
    reads = reads_of(n, m, size)
    options = TurnOptions()
    samples: dict[bool, list[list[int]]] = {mode: [] for mode in modes}
    events = 0
    for i in range(repeat + repeat // 5):  # the first fifth warms up
        for mode in modes:  # interleaved: both see the same machine
            set_fast(mode)
            t, events = one(reads, options)
            if i >= repeat // 5:
                samples[mode].append(t)
    result = {}
    for mode in modes:
        stages = [statistics.median(col) / 1000 for col in zip(*samples[mode], strict=True)]
        total = statistics.median(sum(t) for t in samples[mode]) / 1000
        result[mode] = {"stages": stages, "total": total, "events": events}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 200, 2000])
    parser.add_argument("--m", type=int, default=50)
    parser.add_argument("--read", type=int, default=65536, help="bytes per backend read")
    parser.add_argument("--repeat", type=int, default=200)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--plain", action="store_true", help="only the reference paths")
    which.add_argument("--fast", action="store_true", help="only the fast paths")
    args = parser.parse_args()
    modes = [False] if args.plain else [True] if args.fast else [False, True]
    print("µs per request (median);", " | ".join(STAGES), "| total | µs/event")
    for n in args.n:
        repeat = args.repeat if n < 1000 else max(20, args.repeat // 5)
        result = measure(n, args.m, args.read, repeat, modes)
        for mode in modes:
            r = result[mode]
            cells = " ".join(f"{s:8.1f}" for s in r["stages"])
            name = "fast " if mode else "plain"
            per = r["total"] / r["events"]
            print(f"N={n:<5} {name} {cells} {r['total']:9.1f} {per:6.2f}  ({r['events']} events)")
        if len(modes) == 2:
            ratio = result[True]["total"] / result[False]["total"]
            print(f"N={n:<5} fast/plain {ratio:.2f}")


if __name__ == "__main__":
    main()
