"""The OutputItemStreamer alone: events per second against an orjson floor, same run.

A recorded delta sequence (N text deltas, then a namespaced tool call with M argument
fragments, finish, usage) goes through a fresh streamer per turn, one delta per batch as
an upstream read would deliver it. The floor is what no streamer can beat: orjson-encoding
the very same event dicts, nothing else. Both are timed in this process, interleaved, and
the median of the repeats is reported with their ratio.

    python bench/bench_streamer.py [--text 200] [--args 50] [--repeat 15] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import orjson

from streamer.core.deltas import Delta, Finish, TextDelta, ToolCallDelta, Usage
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames

TOOLS = [
    {
        "type": "namespace",
        "name": "mcp__bench",
        "description": "Tools in the mcp__bench namespace.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]
REQUEST: dict[str, Any] = {"model": "bench", "tools": TOOLS, "input": "hi"}


def recorded_deltas(text: int, args: int) -> list[list[Delta]]:
    """One batch per upstream read, as a Chat backend streams a turn."""
    batches: list[list[Delta]] = [[TextDelta(f"word{i} ")] for i in range(text)]
    batches.append([ToolCallDelta(0, "call_bench", "mcp__bench__lookup", "")])
    batches += [[ToolCallDelta(0, None, None, f'"k{i}":{i},')] for i in range(args)]
    batches.append([Finish("tool_calls"), Usage(100, text + args)])
    return batches


def run_turn(names: ResponsesToolNames, batches: list[list[Delta]]) -> int:
    streamer = OutputItemStreamer(names, new_response(REQUEST))
    count = len(streamer.start())
    for batch in batches:
        count += len(streamer.feed(batch))
    return count + len(streamer.finish())


def measure(text: int, args: int, repeat: int, turns: int) -> dict[str, Any]:
    names = ResponsesToolNames.convert(TOOLS)
    batches = recorded_deltas(text, args)
    # The floor's input: the same events as dicts, decoded once outside the timing.
    streamer = OutputItemStreamer(names, new_response(REQUEST))
    events = streamer.start()
    for batch in batches:
        events += streamer.feed(batch)
    events += streamer.finish()
    dicts = [orjson.loads(e.data) for e in events]
    per_turn = len(dicts)
    dumps = orjson.dumps

    streamer_rates, floor_rates = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(turns):
            run_turn(names, batches)
        t1 = time.perf_counter()
        for _ in range(turns):
            for d in dicts:
                dumps(d)
        t2 = time.perf_counter()
        streamer_rates.append(per_turn * turns / (t1 - t0))
        floor_rates.append(per_turn * turns / (t2 - t1))
    s, f = statistics.median(streamer_rates), statistics.median(floor_rates)
    return {
        "text_deltas": text,
        "argument_fragments": args,
        "events_per_turn": per_turn,
        "streamer_events_per_s": round(s),
        "floor_events_per_s": round(f),
        "ratio_to_floor": round(s / f, 3),
        "us_per_event": round(1e6 / s, 3),
        "repeats": repeat,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=int, default=200)
    parser.add_argument("--args", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)
    result = measure(opts.text, opts.args, opts.repeat, opts.turns)
    if opts.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        print(
            f"OutputItemStreamer: {result['streamer_events_per_s']:,} events/s "
            f"({result['us_per_event']} us/event, {result['events_per_turn']} events/turn)\n"
            f"orjson floor:       {result['floor_events_per_s']:,} events/s\n"
            f"ratio to floor:     {result['ratio_to_floor']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
