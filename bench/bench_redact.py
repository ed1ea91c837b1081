"""What scrubbing secrets out of the output costs per delta, against the streamer's own cost.

A turn's deltas (English-like text tokens, full of the `s` every `sk-...` key starts with,
then tool-argument fragments) go through `_RedactingStream`'s batch scrub with 0, 1 and 3
secrets configured, one delta per batch (a read per token) and eight (a busy backend). With no secret the
gateway does not wrap the stream at all (0 µs by construction; the row times the bare loop
over the batches, for scale). The `OutputItemStreamer` row is the work the same deltas cost
the pipeline anyway, for scale. Medians of the repeats, same run.

    python bench/bench_redact.py [--deltas 2000] [--repeat 15] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from streamer.core.deltas import Delta, TextDelta, ToolCallDelta
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.tools import ResponsesToolNames
from streamer.redact import _RedactingStream, secrets_of

SECRETS = ("sk-upstream-HOSTILE-0123456789abcd", "sk-client-one-000000", "sk-client-two-111111")
WORDS = [
    "this",
    "is",
    "a",
    "sample",
    "answer",
    "whose",
    "tokens",
    "mention",
    "sessions,",
    "keys",
    "and",
    "tasks",
]
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]


def batches(n: int, per_batch: int) -> list[list[Delta]]:
    """`n` text deltas then a call with `n` argument fragments, `per_batch` deltas a read."""
    deltas: list[Delta] = [TextDelta(" " + WORDS[i % len(WORDS)]) for i in range(n)]
    deltas.append(ToolCallDelta(0, "call_1", "lookup", ""))
    deltas += [ToolCallDelta(0, None, None, f'"s{i}":"v{i}",') for i in range(n)]
    return [deltas[i : i + per_batch] for i in range(0, len(deltas), per_batch)]


def timed(run: Callable[[], None], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def scrub_run(data: list[list[Delta]], secrets: tuple[str, ...]) -> Callable[[], None]:
    def run() -> None:
        if not secrets:  # the stream is not wrapped: only the loop the pipeline does anyway
            for batch in data:
                len(batch)
            return
        stream = _RedactingStream(None, secrets)
        scrub = stream._scrub_batch
        for batch in data:
            scrub(batch)

    return run


def streamer_run(data: list[list[Delta]]) -> Callable[[], None]:
    names = ResponsesToolNames.convert(TOOLS)

    def run() -> None:
        streamer = OutputItemStreamer(names, new_response({"model": "b", "tools": TOOLS}))
        streamer.start()
        for batch in data:
            streamer.feed(batch)
        streamer.finish()

    return run


def measure(n: int, repeat: int) -> dict[str, Any]:
    rows: dict[str, float] = {}
    count = 0
    for per_batch in (1, 8):
        data = batches(n, per_batch)
        count = sum(map(len, data))
        cases = (("0 secrets", ()), ("1 secret", SECRETS[:1]), ("3 secrets", SECRETS))
        for label, secrets in cases:
            run = scrub_run(data, secrets_of(secrets))
            rows[f"scrub, {label}, {per_batch}/read"] = timed(run, repeat) / count * 1e6
        rows[f"OutputItemStreamer, {per_batch}/read"] = (
            timed(streamer_run(data), repeat) / count * 1e6
        )
    return {"deltas": count, "us_per_delta": {k: round(v, 3) for k, v in rows.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.deltas, args.repeat)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    print(f"{result['deltas']} deltas, µs per delta (median of {args.repeat}):")
    for label, value in result["us_per_delta"].items():
        print(f"  {label:<32} {value:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
