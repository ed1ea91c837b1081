"""What scrubbing secrets out of the output costs per delta, against the streamer's own cost.

A turn's deltas (English-like text tokens, full of the `s` every `sk-...` key starts with,
then tool-argument fragments) go through `DeltaScrubber` (streamer/core/delta_scrub.py) with
0, 1 and 3 secrets configured, one delta per batch (a read per token) and eight (a busy
backend). With no secret the gateway does not wrap the stream at all (0 µs by construction;
the row times the bare loop over the batches, for scale). The `OutputItemStreamer` row is
the work the same deltas cost the pipeline anyway, for scale. Thread CPU time, medians of
the repeats, same run.

`--compare FILE` times another revision's `streamer/upstream/redact.py` beside this one (`git show
main:streamer/upstream/redact.py > FILE`; one whose stream has `_scrub_batch`, or this one's
`DeltaScrubber`). `delay` is what the scrubber costs in time to first text: how many
characters of the answer had come before its first delta left, for this turn's text and for
one long token (a base64 blob: the whole window waits).

    python bench/bench_redact.py [--deltas 2000] [--repeat 15] [--compare FILE] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import orjson

from streamer.core.delta_scrub import DeltaScrubber
from streamer.core.deltas import Delta, TextDelta, ToolCallDelta
from streamer.core.output import OutputItemStreamer
from streamer.core.response import new_response
from streamer.core.scrub import secrets_of
from streamer.core.tools import ResponsesToolNames

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
Scrub = Callable[[list[Delta]], object]


def deltas(n: int) -> list[Delta]:
    """`n` text deltas then a call with `n` argument fragments."""
    out: list[Delta] = [TextDelta(" " + WORDS[i % len(WORDS)]) for i in range(n)]
    out.append(ToolCallDelta(0, "call_1", "lookup", ""))
    out += [ToolCallDelta(0, None, None, f'"s{i}":"v{i}",') for i in range(n)]
    return out


def batches(n: int, per_batch: int) -> list[list[Delta]]:
    data = deltas(n)
    return [data[i : i + per_batch] for i in range(0, len(data), per_batch)]


def fresh(data: list[list[Delta]]) -> list[list[Delta]]:
    """New delta objects (a scrubber may write into the ones it holds)."""
    return [
        [
            ToolCallDelta(d.index, d.id, d.name, d.arguments)
            if isinstance(d, ToolCallDelta)
            else TextDelta(d.text)  # type: ignore[union-attr]
            for d in batch
        ]
        for batch in data
    ]


def timed(make: Callable[[], Callable[[], None]], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        run = make()
        started = time.thread_time_ns()
        run()
        samples.append(time.thread_time_ns() - started)
    return statistics.median(samples) / 1e9


def this_scrubber(secrets: tuple[str, ...]) -> tuple[Scrub, Callable[[], object]]:
    scrubber = DeltaScrubber(secrets)
    return scrubber.feed, scrubber.flush


def loaded(path: str) -> Callable[[tuple[str, ...]], tuple[Scrub, Callable[[], object]]]:
    """Another revision's redact.py, as a maker of (scrub a batch, end) for some secrets."""
    spec = importlib.util.spec_from_file_location("redact_compared", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "DeltaScrubber"):
        return lambda secrets: (module.DeltaScrubber(secrets).feed, list)

    def make(secrets: tuple[str, ...]) -> tuple[Scrub, Callable[[], object]]:
        stream = module._RedactingStream(_Inner(), secrets)
        return stream._scrub_batch, stream._flush

    return make


class _Inner:
    first = None


def scrub_run(
    data: list[list[Delta]], secrets: tuple[str, ...], maker: Any = this_scrubber
) -> Callable[[], Callable[[], None]]:
    def make() -> Callable[[], None]:
        copy = fresh(data)
        if not secrets:  # the stream is not wrapped: only the loop the pipeline does anyway

            def bare() -> None:
                for batch in copy:
                    len(batch)

            return bare
        scrub, end = maker(secrets)

        def run() -> None:
            for batch in copy:
                scrub(batch)
            end()

        return run

    return make


def streamer_run(data: list[list[Delta]]) -> Callable[[], Callable[[], None]]:
    names = ResponsesToolNames.convert(TOOLS)

    def make() -> Callable[[], None]:
        copy = fresh(data)

        def run() -> None:
            streamer = OutputItemStreamer(names, new_response({"model": "b", "tools": TOOLS}))
            streamer.start()
            for batch in copy:
                streamer.feed(batch)
            streamer.finish()

        return run

    return make


def delay(secrets: tuple[str, ...], pieces: list[str]) -> int:
    """Characters that had come when the first piece left (all of them: it left at the end)."""
    scrubber = DeltaScrubber(secrets)
    came = 0
    for piece in pieces:
        came += len(piece)
        if scrubber.feed([TextDelta(piece)]):
            return came
    return came


def measure(n: int, repeat: int, compare: str | None) -> dict[str, Any]:
    rows: dict[str, float] = {}
    count = 0
    other = loaded(compare) if compare else None
    for per_batch in (1, 8):
        data = batches(n, per_batch)
        count = sum(map(len, data))
        cases = (("0 secrets", ()), ("1 secret", SECRETS[:1]), ("3 secrets", SECRETS))
        for label, secrets in cases:
            run = scrub_run(data, secrets_of(secrets))
            rows[f"scrub, {label}, {per_batch}/read"] = timed(run, repeat) / count * 1e6
            if other is not None and secrets:
                run = scrub_run(data, secrets_of(secrets), other)
                rows[f"compared, {label}, {per_batch}/read"] = timed(run, repeat) / count * 1e6
        rows[f"OutputItemStreamer, {per_batch}/read"] = (
            timed(streamer_run(data), repeat) / count * 1e6
        )
    text = [" " + WORDS[i % len(WORDS)] for i in range(n)]
    blob = ["QUJD" for _ in range(n)]  # base64: one token as long as the answer
    delays = {
        "text, 1 secret": delay(SECRETS[:1], text),
        "one long token, 1 secret": delay(SECRETS[:1], blob),
    }
    return {
        "deltas": count,
        "us_per_delta": {k: round(v, 3) for k, v in rows.items()},
        "first_text_delay_chars": delays,
        "window_chars": DeltaScrubber(SECRETS[:1]).window,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--compare", help="another revision's streamer/upstream/redact.py")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.deltas, args.repeat, args.compare)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    print(f"{result['deltas']} deltas, thread CPU µs per delta (median of {args.repeat}):")
    for label, value in result["us_per_delta"].items():
        print(f"  {label:<34} {value:8.3f}")
    print(f"window (1 secret): {result['window_chars']} characters; first text left after:")
    for label, value in result["first_text_delay_chars"].items():
        print(f"  {label:<34} {value:5d} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
